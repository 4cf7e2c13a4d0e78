// dsinfer tests: grouped-query attention (attention_causal / attention_isa).
//
// Checks, for every ISA path this CPU can run:
//  - every output row is bit-identical (memcmp) to the per-row specification for that
//    path (attend_row_avx2 on AVX2 and AVX-512, attend_row_scalar on scalar), over head_dim
//    64/128/80 (multiples of 16), 8/24 (16k + 8) and 20 (the per-row fallback), GQA
//    groups 1..8, blocks of 1..300 rows, start positions 0..600, causal and non-causal,
//    unaligned rows;
//  - batch invariance: a row computed alone, inside its block, or inside a call with
//    several blocks, with 1, 2 or 3 threads and work items cut as small as one vector,
//    gives identical bits;
//  - exp_shifted_sum_avx512 (the softmax the AVX-512 path uses) equals exp_shifted_sum_avx2;
//  - the public entry point equals attention_isa at isa_level() with the global pool.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/softmax.h"

namespace dsinfer {
namespace {

using attention_detail::attention_isa;
using attention_detail::hardware_isa_level;

std::vector<IsaLevel> isas() {
  std::vector<IsaLevel> v{IsaLevel::Scalar};
  if (hardware_isa_level() >= IsaLevel::Avx2) v.push_back(IsaLevel::Avx2);
  if (hardware_isa_level() >= IsaLevel::Avx512) v.push_back(IsaLevel::Avx512);
  return v;
}

struct Shape {
  int head_dim = 64, group = 3, n_kv = 2, n_q = 1, start = 0;
  bool causal = true;
  int n_heads() const { return group * n_kv; }
  int keys() const { return start + n_q; }  // cache rows the block needs
  std::string str() const {
    return "D=" + std::to_string(head_dim) + " group=" + std::to_string(group) + " n_kv=" + std::to_string(n_kv) +
           " n_q=" + std::to_string(n_q) + " start=" + std::to_string(start) + (causal ? " causal" : " non-causal");
  }
};

// One sequence: its cache ([n_kv][cap][D], cap = exactly the rows needed), the block's
// queries and an output buffer, each `misalign` floats past a 64-byte boundary.
struct Seq {
  Shape s;
  int misalign = 0;
  std::vector<float> k, v, q, out;
  AttentionBlock block() {
    AttentionBlock b;
    const int64_t row = int64_t{s.n_heads()} * s.head_dim;
    b.q = q.data() + misalign;
    b.q_stride = row;
    b.n_q = s.n_q;
    b.start_pos = s.start;
    b.causal = s.causal;
    b.k = k.data() + misalign;
    b.v = v.data() + misalign;
    b.kv_head_stride = int64_t{s.keys()} * s.head_dim;
    b.out = out.data() + misalign;
    b.out_stride = row;
    return b;
  }
  const float* out_row(int i, int h) const {
    return out.data() + misalign + (int64_t{i} * s.n_heads() + h) * s.head_dim;
  }
};

Seq make_seq(const Shape& s, uint32_t seed, int misalign = 0) {
  Seq q;
  q.s = s;
  q.misalign = misalign;
  std::mt19937 rng(seed);
  // q spread wide enough that the softmax is far from uniform (scores of several units).
  std::uniform_real_distribution<float> uk(-1.0f, 1.0f), uq(-3.0f, 3.0f);
  const size_t cache = static_cast<size_t>(s.n_kv) * s.keys() * s.head_dim + misalign;
  const size_t rows = static_cast<size_t>(s.n_q) * s.n_heads() * s.head_dim + misalign;
  q.k.resize(cache);
  q.v.resize(cache);
  q.q.resize(rows);
  q.out.assign(rows, std::nanf(""));
  for (auto& x : q.k) x = uk(rng);
  for (auto& x : q.v) x = uk(rng);
  for (auto& x : q.q) x = uq(rng);
  return q;
}

float scale_for(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

// The per-row specification of one (row, head) output for `isa`.
std::vector<float> reference(IsaLevel isa, const Seq& sq, int i, int h) {
  const Shape& s = sq.s;
  const int g = h / s.group, n_keys = s.causal ? s.start + i + 1 : s.start + s.n_q;
  const float* qr = sq.q.data() + sq.misalign + (int64_t{i} * s.n_heads() + h) * s.head_dim;
  const float* kg = sq.k.data() + sq.misalign + int64_t{g} * s.keys() * s.head_dim;
  const float* vg = sq.v.data() + sq.misalign + int64_t{g} * s.keys() * s.head_dim;
  std::vector<float> scores(n_keys), out(s.head_dim);
  if (isa == IsaLevel::Scalar) attend_row_scalar(qr, kg, vg, n_keys, s.head_dim, scale_for(s.head_dim), scores.data(), out.data());
  else attend_row_avx2(qr, kg, vg, n_keys, s.head_dim, scale_for(s.head_dim), scores.data(), out.data());
  return out;
}

ThreadPool& pool(int threads) {
  static std::unique_ptr<ThreadPool> pools[4];
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(threads);
  return *pools[threads];
}

// Runs one block and compares every (row, head) with the reference; returns the number
// of mismatching outputs (and reports the first).
int check_against_rows(IsaLevel isa, const Shape& s, int threads, int max_vectors, int misalign, uint32_t seed) {
  Seq sq = make_seq(s, seed, misalign);
  AttentionBlock b = sq.block();
  attention_isa(isa, &b, 1, s.n_heads(), s.n_kv, s.head_dim, scale_for(s.head_dim), &pool(threads), max_vectors);
  int bad = 0;
  for (int i = 0; i < s.n_q; ++i)
    for (int h = 0; h < s.n_heads(); ++h) {
      const std::vector<float> ref = reference(isa, sq, i, h);
      if (std::memcmp(ref.data(), sq.out_row(i, h), ref.size() * sizeof(float)) != 0) {
        if (bad == 0)
          ADD_FAILURE() << isa_level_name(isa) << " " << s.str() << " threads=" << threads
                        << " max_vectors=" << max_vectors << " misalign=" << misalign << ": row " << i << " head "
                        << h << " differs from the per-row kernel";
        ++bad;
      }
    }
  return bad;
}

TEST(Attention, GroupedMatchesPerRowBitsSmallBlocks) {
  uint32_t seed = 1;
  for (IsaLevel isa : isas())
    for (int D : {64, 128, 80, 8, 24, 20})
      for (int group : {1, 2, 3, 4, 8})
        for (int n_q : {1, 2, 3, 7, 9})
          for (int start : {0, 1, 5, 600})
            for (bool causal : {true, false}) {
              Shape s;
              s.head_dim = D;
              s.group = group;
              s.n_q = n_q;
              s.start = start;
              s.causal = causal;
              EXPECT_EQ(check_against_rows(isa, s, 1, attention_detail::kMaxGroupVectors, 0, seed++), 0);
            }
}

TEST(Attention, GroupedMatchesPerRowBitsLongBlocks) {
  uint32_t seed = 1000;
  for (IsaLevel isa : isas())
    for (int D : {64, 24, 128})
      for (int group : {3, 1})
        for (int n_q : {64, 300})
          for (int start : {0, 600})
            for (bool causal : {true, false}) {
              if (D == 128 && (n_q == 300 || group == 1)) continue;  // keep the run short
              Shape s;
              s.head_dim = D;
              s.group = group;
              s.n_q = n_q;
              s.start = start;
              s.causal = causal;
              EXPECT_EQ(check_against_rows(isa, s, 2, attention_detail::kMaxGroupVectors, 0, seed++), 0);
            }
}

TEST(Attention, ThreadSplitsAndUnalignedRows) {
  uint32_t seed = 2000;
  for (IsaLevel isa : isas())
    for (int threads : {1, 2, 3})
      for (int max_vectors : {1, 2, 5, attention_detail::kMaxGroupVectors})
        for (int n_q : {1, 9, 64})
          for (int start : {0, 600})
            for (bool causal : {true, false}) {
              Shape s;
              s.group = 3;
              s.n_kv = threads == 3 ? 1 : 2;  // a single KV head must still use every thread
              s.n_q = n_q;
              s.start = start;
              s.causal = causal;
              EXPECT_EQ(check_against_rows(isa, s, threads, max_vectors, (threads + max_vectors) % 3, seed++), 0);
            }
}

// Row i of a block computed alone (a block of one row whose key count is that row's) and
// inside its block, inside a call with other blocks, and split every which way.
TEST(Attention, BatchInvariance) {
  for (IsaLevel isa : isas())
    for (int D : {64, 24, 8})
      for (bool causal : {true, false}) {
        std::vector<Shape> shapes(3);
        const int n_qs[3] = {9, 1, 30}, starts[3] = {600, 37, 5};
        std::vector<Seq> seqs;
        for (int b = 0; b < 3; ++b) {
          shapes[b].head_dim = D;
          shapes[b].n_q = n_qs[b];
          shapes[b].start = starts[b];
          shapes[b].causal = causal;
          seqs.push_back(make_seq(shapes[b], 77 + b));
        }
        const Shape& s0 = shapes[0];
        const float scale = scale_for(D);
        // Each row of block 0 alone: its query row and cache, with a one-row block whose
        // start gives it the same keys.
        std::vector<std::vector<float>> alone(s0.n_q);
        for (int i = 0; i < s0.n_q; ++i) {
          Seq one = seqs[0];
          AttentionBlock b = one.block();
          b.q = seqs[0].q.data() + i * b.q_stride;
          b.out = one.out.data() + i * b.out_stride;
          b.n_q = 1;
          b.start_pos = causal ? s0.start + i : s0.start + s0.n_q - 1;
          attention_isa(isa, &b, 1, s0.n_heads(), s0.n_kv, D, scale, &pool(1));
          alone[i].assign(b.out, b.out + b.out_stride);
        }
        for (int threads : {1, 2, 3})
          for (int max_vectors : {1, 4, attention_detail::kMaxGroupVectors})
            for (int n_blocks : {1, 3}) {
              std::vector<AttentionBlock> blocks;
              for (int b = 0; b < n_blocks; ++b) {
                std::fill(seqs[b].out.begin(), seqs[b].out.end(), std::nanf(""));
                blocks.push_back(seqs[b].block());
              }
              attention_isa(isa, blocks.data(), n_blocks, s0.n_heads(), s0.n_kv, D, scale, &pool(threads),
                            max_vectors);
              for (int i = 0; i < s0.n_q; ++i)
                EXPECT_EQ(std::memcmp(alone[i].data(), seqs[0].out_row(i, 0), alone[i].size() * sizeof(float)), 0)
                    << isa_level_name(isa) << " D=" << D << (causal ? " causal" : " non-causal") << " row " << i
                    << " threads=" << threads << " max_vectors=" << max_vectors << " n_blocks=" << n_blocks;
            }
      }
}

// The AVX-512 softmax numerators the grouped kernel uses on AVX-512 CPUs must be those of
// exp_shifted_sum_avx2, for every length and every kind of value.
TEST(Attention, ExpShiftedSumAvx512MatchesAvx2Bits) {
  if (hardware_isa_level() < IsaLevel::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> wide(-120.0f, 10.0f), narrow(-2.0f, 2.0f);
  const float specials[] = {0.0f, -0.0f, -87.0f, -88.0f, -1e30f, 1e-40f, -1e-40f};
  for (int n : {0, 1, 5, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 47, 48, 64, 100, 601, 2001})
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> x(n), e2(n), e5(n);
      for (int i = 0; i < n; ++i)
        x[i] = kind == 0 ? narrow(rng) : kind == 1 ? wide(rng) : specials[rng() % std::size(specials)];
      const float s2 = exp_shifted_sum_avx2(x.data(), e2.data(), n);
      const float s5 = exp_shifted_sum_avx512(x.data(), e5.data(), n);
      EXPECT_EQ(std::memcmp(&s2, &s5, sizeof s2), 0) << "n=" << n << " kind=" << kind;
      EXPECT_EQ(std::memcmp(e2.data(), e5.data(), n * sizeof(float)), 0) << "n=" << n << " kind=" << kind;
    }
}

TEST(Attention, PublicEntryPointUsesIsaLevelAndGlobalPool) {
  Shape s;
  s.n_q = 9;
  s.start = 100;
  Seq a = make_seq(s, 5), b = make_seq(s, 5);
  AttentionBlock ba = a.block(), bb = b.block();
  attention_causal(&ba, 1, s.n_heads(), s.n_kv, s.head_dim, scale_for(s.head_dim));
  attention_isa(isa_level(), &bb, 1, s.n_heads(), s.n_kv, s.head_dim, scale_for(s.head_dim), &pool(1));
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
}

TEST(Attention, EmptyBlocksAreSkipped) {
  Shape s;
  s.n_q = 2;
  s.start = 3;
  Seq a = make_seq(s, 9);
  AttentionBlock blocks[2] = {a.block(), a.block()};
  blocks[0].n_q = 0;
  blocks[0].out = nullptr;
  attention_isa(isa_level(), blocks, 2, s.n_heads(), s.n_kv, s.head_dim, scale_for(s.head_dim), &pool(2));
  for (int h = 0; h < s.n_heads(); ++h) {
    const std::vector<float> ref = reference(std::min(isa_level(), hardware_isa_level()), a, 1, h);
    EXPECT_EQ(std::memcmp(ref.data(), a.out_row(1, h), ref.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace dsinfer
