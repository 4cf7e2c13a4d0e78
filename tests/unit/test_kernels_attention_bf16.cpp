// dsinfer tests: attention over a BF16 K/V cache (the target's cache in bf16 matmul
// precision) against its scalar specification, attend_row_bf16_reference (attention.h
// states its order of operations).
//
// Checks:
//  - kv_round_bf16 gives matmul's x_to_bf16 bits (flush subnormals, round to nearest even,
//    NaN quieted) for every length and alignment;
//  - the reference's scores are matmul's Bf16Dot dot products (an independently specified
//    and tested order) times the scale, on every matmul path this CPU has;
//  - every output row of the grouped kernels -- native vdpbf16ps and its AVX-512F
//    emulation -- and of the per-row fallback (other head sizes, AVX2 and scalar ISA
//    levels) is bit-identical (memcmp) to the reference, including inputs whose products
//    and sums underflow (flushed to zero) and overflow;
//  - batch invariance: a row computed alone, inside its block, or with other blocks, with
//    1-3 threads and work items as small as one vector, gives identical bits;
//  - a paged BF16 cache gives the dense cache's bits for block sizes 1..64.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer {
namespace {

using attention_detail::attention_isa;
using attention_detail::Bf16Kernel;
using attention_detail::hardware_isa_level;

ThreadPool& pool(int threads) {
  static std::unique_ptr<ThreadPool> pools[4];
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(threads);
  return *pools[threads];
}

// Every (ISA level, BF16 kernel) pair this CPU can run.
struct PathCase {
  IsaLevel isa;
  Bf16Kernel kern;
  std::string name;
};
std::vector<PathCase> paths() {
  std::vector<PathCase> v{{IsaLevel::Scalar, Bf16Kernel::Native, "scalar"}};
  if (hardware_isa_level() >= IsaLevel::Avx2) v.push_back({IsaLevel::Avx2, Bf16Kernel::Native, "avx2"});
  if (hardware_isa_level() >= IsaLevel::Avx512) {
    v.push_back({IsaLevel::Avx512, Bf16Kernel::Emulated, "avx512-emulated"});
    if (cpu_features().avx512bf16) v.push_back({IsaLevel::Avx512, Bf16Kernel::Native, "avx512bf16"});
  }
  return v;
}

// Values of mixed magnitude: mostly uniform in [-a, a], some tiny (products that
// underflow), some subnormal, some zero of either sign.
float draw(std::mt19937& rng, float a, bool extremes) {
  std::uniform_real_distribution<float> u(-a, a);
  if (!extremes) return u(rng);
  switch (rng() % 16) {
    case 0: return u(rng) * 1e-19f;   // products ~1e-38: around FLT_MIN
    case 1: return u(rng) * 1e-20f;   // products below FLT_MIN: flushed
    case 2: return u(rng) * 1e-39f;   // subnormal input: counts as zero
    case 3: return (rng() & 1) ? 0.0f : -0.0f;
    default: return u(rng);
  }
}

struct Shape {
  int head_dim = 64, group = 3, n_kv = 2, n_q = 1, start = 0;
  bool causal = true;
  int n_heads() const { return group * n_kv; }
  int keys() const { return start + n_q; }
  std::string str() const {
    return "D=" + std::to_string(head_dim) + " group=" + std::to_string(group) + " n_kv=" + std::to_string(n_kv) +
           " n_q=" + std::to_string(n_q) + " start=" + std::to_string(start) + (causal ? " causal" : " non-causal");
  }
};

// One sequence: a dense BF16 cache [n_kv][keys][D] (rounded by kv_round_bf16, as the model
// writes it), F32 queries, an output buffer.
struct Seq {
  Shape s;
  std::vector<uint16_t> k, v;
  std::vector<float> q, out;
  AttentionBlock block() {
    AttentionBlock b;
    b.q = q.data();
    b.q_stride = int64_t{s.n_heads()} * s.head_dim;
    b.n_q = s.n_q;
    b.start_pos = s.start;
    b.causal = s.causal;
    b.k_bf16 = k.data();
    b.v_bf16 = v.data();
    b.kv_head_stride = int64_t{s.keys()} * s.head_dim;
    b.out = out.data();
    b.out_stride = b.q_stride;
    return b;
  }
  const float* out_row(int i, int h) const { return out.data() + (int64_t{i} * s.n_heads() + h) * s.head_dim; }
};

Seq make_seq(const Shape& s, uint32_t seed, bool extremes = false) {
  Seq q;
  q.s = s;
  std::mt19937 rng(seed);
  const size_t cache = static_cast<size_t>(s.n_kv) * s.keys() * s.head_dim;
  std::vector<float> kf(cache), vf(cache);
  for (auto& x : kf) x = draw(rng, 1.0f, extremes);
  for (auto& x : vf) x = draw(rng, 1.0f, extremes);
  q.k.resize(cache);
  q.v.resize(cache);
  kv_round_bf16(kf.data(), static_cast<int64_t>(cache), q.k.data());
  kv_round_bf16(vf.data(), static_cast<int64_t>(cache), q.v.data());
  q.q.resize(static_cast<size_t>(s.n_q) * s.n_heads() * s.head_dim);
  for (auto& x : q.q) x = draw(rng, 3.0f, extremes);
  q.out.assign(q.q.size(), std::nanf(""));
  return q;
}

float scale_for(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

std::vector<float> reference(const Seq& sq, int i, int h) {
  const Shape& s = sq.s;
  const int g = h / s.group, n_keys = s.causal ? s.start + i + 1 : s.start + s.n_q;
  const int64_t kv = int64_t{g} * s.keys() * s.head_dim;
  std::vector<float> scores(static_cast<size_t>(n_keys)), out(static_cast<size_t>(s.head_dim));
  attend_row_bf16_reference(sq.q.data() + (int64_t{i} * s.n_heads() + h) * s.head_dim, sq.k.data() + kv,
                            sq.v.data() + kv, n_keys, s.head_dim, scale_for(s.head_dim), scores.data(), out.data());
  return out;
}

int check(const PathCase& p, const Shape& s, int threads, int max_vectors, uint32_t seed, bool extremes = false) {
  Seq sq = make_seq(s, seed, extremes);
  AttentionBlock b = sq.block();
  attention_isa(p.isa, &b, 1, s.n_heads(), s.n_kv, s.head_dim, scale_for(s.head_dim), &pool(threads), max_vectors,
                p.kern);
  int bad = 0;
  for (int i = 0; i < s.n_q; ++i)
    for (int h = 0; h < s.n_heads(); ++h) {
      const std::vector<float> ref = reference(sq, i, h);
      if (std::memcmp(ref.data(), sq.out_row(i, h), ref.size() * sizeof(float)) != 0) {
        if (bad == 0)
          ADD_FAILURE() << p.name << " " << s.str() << " threads=" << threads << " max_vectors=" << max_vectors
                        << (extremes ? " extremes" : "") << ": row " << i << " head " << h
                        << " differs from attend_row_bf16_reference";
        ++bad;
      }
    }
  return bad;
}

TEST(AttentionBf16, KvRoundMatchesMatmulRounding) {
  std::mt19937 rng(7);
  std::vector<float> src(200);
  const float specials[] = {0.0f, -0.0f, 1e-39f, -1e-39f, FLT_MIN, -FLT_MIN, INFINITY, -INFINITY, std::nanf(""),
                            1.00390625f /* tie: 1 + 2^-8 */, 1.01171875f /* tie, odd */, FLT_MAX};
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = i < std::size(specials) ? specials[i] : draw(rng, 1e3f, true);
  for (int n : {1, 7, 15, 16, 17, 31, 64, 65, 190})
    for (int off : {0, 1, 3}) {
      std::vector<uint16_t> dst(static_cast<size_t>(n + off + 1), 0xBEEF);
      kv_round_bf16(src.data() + off, n, dst.data() + off);
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(dst[static_cast<size_t>(off + i)], matmul_detail::x_to_bf16(src[static_cast<size_t>(off + i)]))
            << "n=" << n << " off=" << off << " i=" << i;
      ASSERT_EQ(dst[static_cast<size_t>(off + n)], 0xBEEF) << "wrote past the end";
    }
}

// With scale 1 a score is exactly matmul's Bf16Dot product of the query with the key row.
TEST(AttentionBf16, ReferenceScoresAreMatmulBf16DotProducts) {
  for (int D : {32, 64, 128, 20, 80}) {
    for (bool extremes : {false, true}) {
      std::mt19937 rng(static_cast<uint32_t>(D * 2 + extremes));
      const int n_keys = 37;
      std::vector<float> q(static_cast<size_t>(D)), kf(static_cast<size_t>(n_keys) * D);
      for (auto& x : q) x = draw(rng, 3.0f, extremes);
      for (auto& x : kf) x = draw(rng, 1.0f, extremes);
      std::vector<uint16_t> k(kf.size());
      kv_round_bf16(kf.data(), static_cast<int64_t>(kf.size()), k.data());
      WeightView w;
      w.data = k.data();
      w.dtype = DType::BF16;
      w.rows = n_keys;
      w.cols = D;
      std::vector<float> y(static_cast<size_t>(n_keys));
      for (matmul_detail::Path path : {matmul_detail::Path::Scalar, matmul_detail::Path::Avx2,
                                       matmul_detail::Path::Avx512, matmul_detail::Path::Avx512Bf16}) {
        matmul_detail::matmul_path(path, MatmulPrecision::Bf16Dot, q.data(), 1, w, y.data(), &pool(1));
        std::vector<float> raw(static_cast<size_t>(n_keys));
        attend_scores_bf16_reference(q.data(), k.data(), n_keys, D, 1.0f, raw.data());
        ASSERT_EQ(std::memcmp(raw.data(), y.data(), y.size() * sizeof(float)), 0)
            << "D=" << D << (extremes ? " extremes" : "") << " path " << matmul_detail::path_name(path);
      }
    }
  }
}

TEST(AttentionBf16, GroupedMatchesReferenceBits) {
  for (const PathCase& p : paths()) {
    int bad = 0;
    for (int D : {64, 32, 128, 96, 20, 48})
      for (int group : {1, 3, 8})
        for (int n_q : {1, 2, 5, 6, 9, 17})
          for (int start : {0, 3, 31, 130})
            for (bool causal : {true, false}) {
              Shape s{D, group, 2, n_q, start, causal};
              bad += check(p, s, 1, attention_detail::kMaxGroupVectors, static_cast<uint32_t>(D + 7 * n_q + start));
            }
    EXPECT_EQ(bad, 0) << p.name;
  }
}

TEST(AttentionBf16, LongContextAndExtremeValues) {
  for (const PathCase& p : paths()) {
    int bad = 0;
    for (int start : {599, 1000})
      for (int n_q : {1, 6, 9}) bad += check(p, Shape{64, 3, 2, n_q, start, true}, 1, 48, 11u + start + n_q);
    for (int seed = 0; seed < 6; ++seed)
      bad += check(p, Shape{64, 3, 2, 7, 40 + seed * 17, seed % 2 == 0}, 1, 48, 100u + seed, /*extremes=*/true);
    bad += check(p, Shape{128, 4, 1, 3, 70, true}, 1, 48, 5u, true);
    EXPECT_EQ(bad, 0) << p.name;
  }
}

TEST(AttentionBf16, ThreadSplitsChangeNoBit) {
  for (const PathCase& p : paths())
    for (int threads : {1, 2, 3})
      for (int max_vectors : {1, 2, 5, 48}) {
        EXPECT_EQ(check(p, Shape{64, 3, 2, 9, 57, true}, threads, max_vectors, 3u), 0);
        EXPECT_EQ(check(p, Shape{64, 3, 2, 6, 200, false}, threads, max_vectors, 4u), 0);
      }
}

// A row alone, in its block, and in a call with other sequences' blocks: same bits.
TEST(AttentionBf16, BatchInvariance) {
  for (const PathCase& p : paths()) {
    const Shape big{64, 3, 2, 9, 120, true};
    Seq whole = make_seq(big, 21);
    Seq other = make_seq(Shape{64, 3, 2, 4, 33, true}, 22);
    AttentionBlock bs[2] = {other.block(), whole.block()};
    attention_isa(p.isa, bs, 2, 6, 2, 64, scale_for(64), &pool(2), 48, p.kern);
    for (int i = 0; i < big.n_q; ++i) {
      // Row i alone: a one-row block at start_pos start + i over the same cache.
      Seq alone = whole;
      alone.out.assign(alone.out.size(), std::nanf(""));
      AttentionBlock b = alone.block();
      b.q = alone.q.data() + int64_t{i} * b.q_stride;
      b.out = alone.out.data() + int64_t{i} * b.out_stride;
      b.n_q = 1;
      b.start_pos = big.start + i;
      attention_isa(p.isa, &b, 1, 6, 2, 64, scale_for(64), &pool(1), 48, p.kern);
      for (int h = 0; h < 6; ++h)
        ASSERT_EQ(std::memcmp(alone.out_row(i, h), whole.out_row(i, h), 64 * sizeof(float)), 0)
            << p.name << " row " << i << " head " << h;
    }
  }
}

// Native and emulated kernels, and the AVX2 / scalar levels, give one set of bits.
TEST(AttentionBf16, EveryPathGivesTheSameBits) {
  const Shape s{64, 3, 2, 6, 300, true};
  std::vector<float> first;
  for (const PathCase& p : paths()) {
    Seq sq = make_seq(s, 31, true);
    AttentionBlock b = sq.block();
    attention_isa(p.isa, &b, 1, s.n_heads(), s.n_kv, s.head_dim, scale_for(64), &pool(1), 48, p.kern);
    if (first.empty()) first = sq.out;
    else EXPECT_EQ(std::memcmp(first.data(), sq.out.data(), first.size() * sizeof(float)), 0) << p.name;
  }
}

TEST(AttentionBf16, PagedEqualsDense) {
  for (const PathCase& p : paths())
    for (int D : {64, 48})
      for (int P : {1, 3, 16, 64})
        for (int start : {0, 45, 130}) {
          const Shape s{D, 3, 2, 6, start, true};
          Seq dense = make_seq(s, static_cast<uint32_t>(P + start));
          AttentionBlock b = dense.block();
          attention_isa(p.isa, &b, 1, s.n_heads(), s.n_kv, D, scale_for(D), &pool(1), 48, p.kern);
          // The same K/V scattered over shuffled blocks (plus unused ones full of NaN).
          const int keys = s.keys(), n_pages = (keys + P - 1) / P, n_blocks = n_pages + 2;
          std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
          std::iota(ids.begin(), ids.end(), 0);
          std::mt19937 rng(static_cast<uint32_t>(P));
          std::shuffle(ids.begin(), ids.end(), rng);
          ids.resize(static_cast<size_t>(n_pages));
          const int64_t bstride = int64_t{s.n_kv} * P * D;
          std::vector<uint16_t> pk(static_cast<size_t>(n_blocks * bstride), 0x7fc1), pv(pk);
          for (int g = 0; g < s.n_kv; ++g)
            for (int pos = 0; pos < keys; ++pos) {
              const int64_t dst = ids[static_cast<size_t>(pos / P)] * bstride + int64_t{g} * P * D + int64_t{pos % P} * D;
              const int64_t src = (int64_t{g} * keys + pos) * D;
              std::memcpy(&pk[static_cast<size_t>(dst)], &dense.k[static_cast<size_t>(src)], D * sizeof(uint16_t));
              std::memcpy(&pv[static_cast<size_t>(dst)], &dense.v[static_cast<size_t>(src)], D * sizeof(uint16_t));
            }
          std::vector<float> out(dense.out.size(), 5.0f);
          AttentionBlock pb = dense.block();
          pb.k_bf16 = pk.data();
          pb.v_bf16 = pv.data();
          pb.kv_head_stride = int64_t{P} * D;
          pb.block_ids = ids.data();
          pb.block_stride = bstride;
          pb.page_size = P;
          pb.out = out.data();
          attention_isa(p.isa, &pb, 1, s.n_heads(), s.n_kv, D, scale_for(D), &pool(1), 48, p.kern);
          ASSERT_EQ(std::memcmp(out.data(), dense.out.data(), out.size() * sizeof(float)), 0)
              << p.name << " D=" << D << " P=" << P << " start=" << start;
        }
}

}  // namespace
}  // namespace dsinfer
