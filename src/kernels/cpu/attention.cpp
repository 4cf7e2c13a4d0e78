// dsinfer kernels: attention entry point, work split, the grouped driver and the scalar
// core (see attention.h; the grouped layout is in attention_internal.h).
//
// attention_isa() picks a path for the ISA level and head_dim: the grouped AVX-512 kernels
// (head_dim % 16 == 0), the grouped AVX2 ones (head_dim % 8 == 0), else one row at a time
// (attend_row_avx2 / attend_row_scalar). Over a BF16 cache: the grouped AVX512_BF16 kernels
// (or their AVX-512F emulation) for head_dim % 32 == 0, else attend_row_bf16_reference per
// row. It cuts each (block, KV head) into work items of whole query vectors and hands them
// to the thread pool; a vector's reductions always stay inside one item, so the split
// cannot change any bit.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/matmul_internal.h"  // the Bf16Dot scalar specification, FlushSubnormalsScope
#include "kernels/cpu/softmax.h"          // exp_shifted_sum_scalar

namespace dsinfer {

void attend_row_scalar(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                       float* scores, float* out) {
  for (int j = 0; j < n_keys; ++j) {
    const float* kj = k + static_cast<int64_t>(j) * head_dim;
    float d = 0.0f;
    for (int i = 0; i < head_dim; ++i) d += q[i] * kj[i];
    scores[j] = d * scale;
  }
  const float sum = exp_shifted_sum_scalar(scores, scores, n_keys);
  for (int i = 0; i < head_dim; ++i) out[i] = 0.0f;
  for (int j = 0; j < n_keys; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * head_dim;
    const float p = scores[j];
    for (int i = 0; i < head_dim; ++i) out[i] += p * vj[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < head_dim; ++i) out[i] *= inv;
}

namespace {

bool cpu_has_avx2() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}

// a * b as SSE computes it with FTZ set: a result below FLT_MIN after rounding to 24 bits
// with unbounded exponent (x86 detects underflow after rounding) becomes a signed zero.
// (Rounding to the subnormal grid first and flushing after can keep FLT_MIN where FTZ
// gives zero, hence the exact double product at the boundary.)
float mul_ftz(float a, float b) {
  const float r = a * b;
  if (std::fabs(r) > FLT_MIN || std::isnan(r)) return r;
  if (std::fabs(r) < FLT_MIN) return std::copysign(0.0f, r);
  const double d = static_cast<double>(a) * static_cast<double>(b);  // exact
  return std::fabs(d) < static_cast<double>(FLT_MIN) - 0x1p-151 ? std::copysign(0.0f, r) : r;
}

}  // namespace

void kv_round_bf16(const float* src, int64_t n, uint16_t* dst) {
  if (attention_detail::hardware_isa_level() == IsaLevel::Avx512) {
    attention_detail::kv_round_bf16_avx512(src, n, dst);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = matmul_detail::x_to_bf16(src[i]);
}

void attend_scores_bf16_reference(const float* q, const uint16_t* k, int n_keys, int head_dim, float scale,
                                  float* scores) {
  using matmul_detail::bf16_dot_step;
  using matmul_detail::flush_subnormal;
  const int D = head_dim, D32 = (head_dim + 31) & ~31;
  thread_local std::vector<float> qb, kb;  // widened BF16, zero-padded to D32
  qb.assign(static_cast<size_t>(D32), 0.0f);
  kb.assign(static_cast<size_t>(D32), 0.0f);
  for (int i = 0; i < D; ++i) qb[i] = bf16_to_f32(matmul_detail::x_to_bf16(q[i]));
  for (int j = 0; j < n_keys; ++j) {
    const uint16_t* kj = k + static_cast<int64_t>(j) * D;
    for (int i = 0; i < D; ++i) kb[i] = flush_subnormal(bf16_to_f32(kj[i]));
    float p[16] = {};
    for (int c = 0; c < D32; c += 32)
      for (int l = 0; l < 16; ++l) {
        p[l] = bf16_dot_step(p[l], qb[c + 2 * l + 1], kb[c + 2 * l + 1]);
        p[l] = bf16_dot_step(p[l], qb[c + 2 * l], kb[c + 2 * l]);
      }
    scores[j] = mul_ftz(matmul_detail::reduce16_ftz(p), scale);
  }
}

void attend_row_bf16_reference(const float* q, const uint16_t* k, const uint16_t* v, int n_keys, int head_dim,
                               float scale, float* scores, float* out) {
  const int D = head_dim;
  attend_scores_bf16_reference(q, k, n_keys, head_dim, scale, scores);
  const float sum = cpu_has_avx2() ? exp_shifted_sum_avx2(scores, scores, n_keys)
                                   : exp_shifted_sum_scalar(scores, scores, n_keys);
  for (int i = 0; i < D; ++i) out[i] = 0.0f;
  for (int j = 0; j < n_keys; ++j) {
    const uint16_t* vj = v + static_cast<int64_t>(j) * D;
    for (int i = 0; i < D; ++i) out[i] = std::fma(scores[j], bf16_to_f32(vj[i]), out[i]);
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < D; ++i) out[i] *= inv;
}

namespace attention_detail {

namespace {

// Row stride of the score scratch (a multiple of 16 floats keeps rows 64-byte apart).
int64_t score_stride(const QueryGroup& g) { return (static_cast<int64_t>(g.n_keys[g.n - 1]) + 15) & ~int64_t{15}; }

// Keys per block: ~32 KB of K (or V) rows, a multiple of 16 so score tiles of 8 keys and
// the per-key tails fall where they would for the whole range.
int key_block(int head_dim) { return std::max(16, (8192 / head_dim) & ~15); }

// The cache of g in element type T (float: k / v, uint16_t: k16 / v16).
template <class T>
const T* keys_of(const QueryGroup& g) {
  if constexpr (std::is_same_v<T, float>) return g.k;
  else return g.k16;
}
template <class T>
const T* values_of(const QueryGroup& g) {
  if constexpr (std::is_same_v<T, float>) return g.v;
  else return g.v16;
}

// Calls fn(k, v, shift, a, b) for every run [a, b) of keys [j0, j1) that lies in one
// block, key j of the run being at k + (j - shift) * head_dim (likewise v). Dense: one run.
template <class T, class F>
void for_each_run(const QueryGroup& g, int j0, int j1, F&& fn) {
  const T* gk = keys_of<T>(g);
  const T* gv = values_of<T>(g);
  if (!g.block_ids) {
    fn(gk, gv, 0, j0, j1);
    return;
  }
  const int P = g.page_size;
  for (int a = j0; a < j1;) {
    const int page = a / P, first = page * P, b = std::min(j1, first + P);
    const int64_t off = static_cast<int64_t>(g.block_ids[page]) * g.block_stride;
    fn(gk + off, gv + off, first, a, b);
    a = b;
  }
}

// Copies keys and values [0, n) of a paged group into contiguous rows (per-row fallback).
template <class T>
void gather_paged(const QueryGroup& g, int n, T* k_out, T* v_out) {
  const int64_t D = g.head_dim;
  for_each_run<T>(g, 0, n, [&](const T* k, const T* v, int shift, int a, int b) {
    std::copy(k + (a - shift) * D, k + (b - shift) * D, k_out + a * D);
    std::copy(v + (a - shift) * D, v + (b - shift) * D, v_out + a * D);
  });
}

// Keys and values [0, n) of a group as contiguous rows, for the per-row cores: k and v
// themselves, or, for a paged group, their blocks gathered into this thread's buffers
// (grown, never shrunk; valid until the next call with the same T).
template <class T>
std::pair<const T*, const T*> contiguous_kv(const QueryGroup& g, const T* k, const T* v, int n) {
  if (!g.block_ids) return {k, v};
  thread_local std::vector<T> kbuf, vbuf;
  const size_t size = static_cast<size_t>(n) * g.head_dim;
  if (kbuf.size() < size) kbuf.resize(size), vbuf.resize(size);
  gather_paged<T>(g, n, kbuf.data(), vbuf.data());
  return {kbuf.data(), vbuf.data()};
}

// Pass 1 over a BF16 cache, apart so that MXCSR is set around opaque kernel calls only.
template <class Run>
[[gnu::noinline]] void with_flushed_subnormals(const Run& run) {
#if defined(__x86_64__)
  matmul_detail::FlushSubnormalsScope ftz;
#endif
  run();
}

}  // namespace

IsaLevel hardware_isa_level() {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return IsaLevel::Scalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) return IsaLevel::Avx2;
  return IsaLevel::Avx512;
}

// BF16 query vectors of a group: head_dim rounded up to 32 elements each.
int64_t qb_stride(const QueryGroup& g) { return (static_cast<int64_t>(g.head_dim) + 31) & ~int64_t{31}; }

size_t group_scratch_floats(const QueryGroup& g) {
  const size_t scores = static_cast<size_t>(g.n * score_stride(g));
  return g.k16 ? scores + static_cast<size_t>(g.n * qb_stride(g) / 2) : scores;
}

namespace {

// The four passes (attention_internal.h) over a cache of element type T with kernels Kern;
// Q is the query vectors' type the kernels take (float, or uint16_t rounded BF16).
template <class T, class Kern, class Q>
void attend_group_impl(const Kern& kern, const QueryGroup& g, const Q* const* qv, float* scratch) {
  const int n = g.n, D = g.head_dim, n_max = g.n_keys[n - 1], kb = key_block(D);
  const int64_t stride = score_stride(g);
  float* s[kMaxGroupVectors];
  for (int r = 0; r < n; ++r) s[r] = scratch + r * stride;

  // 1. Scores. A tile computes up to its longest vector's key count; the extra scores of
  // its shorter vectors land in their scratch rows past n_keys and are never read.
  auto pass1 = [&] {
    for (int j0 = 0; j0 < n_max; j0 += kb)
      for (int r0 = 0; r0 < n; r0 += kern.score_tile) {
        const int r1 = std::min(n, r0 + kern.score_tile);
        const int j1 = std::min(j0 + kb, g.n_keys[r1 - 1]);
        if (j1 <= j0) continue;
        // Paged: one call per run inside a block, score rows shifted so that index j of the
        // run lands at s[r][j]; a score depends only on its key, so the runs change no bit.
        for_each_run<T>(g, j0, j1, [&](const T* k, const T*, int shift, int a, int b) {
          float* sr[kMaxGroupVectors];
          for (int r = r0; r < r1; ++r) sr[r - r0] = s[r] + shift;
          kern.scores(r1 - r0, qv + r0, k, a - shift, b - shift, D, g.scale, sr, r0 == 0);
        });
      }
  };
  if constexpr (std::is_same_v<T, float>) pass1();
  else with_flushed_subnormals(pass1);

  // 2. Softmax numerators, each vector over its own keys only.
  float inv[kMaxGroupVectors];
  for (int r = 0; r < n; ++r) inv[r] = 1.0f / kern.exp_sum(s[r], s[r], g.n_keys[r]);

  // 3. Values. Within a tile, [first, r1) are the vectors that still have keys at `pos`;
  // they advance together to the next end of a vector's keys (or of the key block).
  for (int j0 = 0; j0 < n_max; j0 += kb) {
    const int j1 = std::min(j0 + kb, n_max);
    for (int r0 = 0; r0 < n; r0 += kern.value_tile) {
      const int r1 = std::min(n, r0 + kern.value_tile);
      int pos = j0, first = r0;
      while (true) {
        while (first < r1 && g.n_keys[first] <= pos) ++first;
        if (first == r1 || pos == j1) break;
        const int end = std::min(j1, g.n_keys[first]);
        // Paged: the fma chain of a lane goes through out_r between runs (exact).
        for_each_run<T>(g, pos, end, [&](const T*, const T* v, int shift, int a, int b) {
          const float* pr[kMaxGroupVectors];
          for (int r = first; r < r1; ++r) pr[r - first] = s[r] + shift;
          kern.values(r1 - first, pr, v, a - shift, b - shift, D, g.out + first, a == 0, r0 == 0);
        });
        pos = end;
      }
    }
  }

  // 4. Normalise.
  for (int r = 0; r < n; ++r) kern.scale_out(g.out[r], D, inv[r]);
}

}  // namespace

void attend_group(const GroupKernels& kern, const QueryGroup& g, float* scratch) {
  attend_group_impl<float>(kern, g, g.q, scratch);
}

void attend_group(const GroupKernelsBf16& kern, const QueryGroup& g, float* scratch) {
  // The rounded query vectors live after the score rows (the kernels load them unaligned).
  uint16_t* qb_base = reinterpret_cast<uint16_t*>(scratch + g.n * score_stride(g));
  const uint16_t* qb[kMaxGroupVectors];
  for (int r = 0; r < g.n; ++r) {
    uint16_t* dst = qb_base + r * qb_stride(g);
    kern.round_q(g.q[r], g.head_dim, dst);
    qb[r] = dst;
  }
  attend_group_impl<uint16_t>(kern, g, qb, scratch);
}

void attention_isa(IsaLevel isa, const AttentionBlock* blocks, int n_blocks, int n_heads, int n_kv_heads,
                   int head_dim, float scale, ThreadPool* pool, int max_vectors, Bf16Kernel bf16_kernel) {
  if (!pool) pool = &ThreadPool::global();
  isa = std::min(isa, hardware_isa_level());
  const GroupKernels* kern = nullptr;
  if (isa == IsaLevel::Avx512 && head_dim % 16 == 0) kern = &group_kernels_avx512();
  else if (isa >= IsaLevel::Avx2 && head_dim % 8 == 0) kern = &group_kernels_avx2();
  const GroupKernelsBf16* kern16 = nullptr;
  if (isa == IsaLevel::Avx512 && head_dim % 32 == 0)
    kern16 = bf16_kernel == Bf16Kernel::Native && cpu_features().avx512bf16 ? &group_kernels_bf16_avx512bf16()
                                                                           : &group_kernels_bf16_avx512();
  const bool avx2_rows = isa >= IsaLevel::Avx2;
  const int group = n_heads / n_kv_heads;
  max_vectors = std::clamp(max_vectors, 1, kMaxGroupVectors);

  // Work items: (block, KV head, range of query vectors). A (block, KV head) is cut into
  // several items only when there are fewer of them than threads, or when it has more
  // vectors than max_vectors (long prefills: the items stay small enough to balance).
  struct Item {
    int block, kv_head, v0, v1;
  };
  thread_local std::vector<Item> item_store;  // grown, never shrunk
  std::vector<Item>& items = item_store;      // (workers must see the caller's list)
  items.clear();
  const int units = std::max(1, n_blocks * n_kv_heads);
  const int split = (pool->size() + units - 1) / units;
  for (int b = 0; b < n_blocks; ++b) {
    const int n_vec = blocks[b].n_q * group;
    if (n_vec <= 0) continue;
    const int per = std::min(max_vectors, (n_vec + split - 1) / split);
    for (int g = 0; g < n_kv_heads; ++g)
      for (int v0 = 0; v0 < n_vec; v0 += per) items.push_back({b, g, v0, std::min(n_vec, v0 + per)});
  }

  pool->parallel_for(items.size(), [&](size_t begin, size_t end) {
    thread_local std::vector<float> scratch;  // grown, never shrunk
    const float* q[kMaxGroupVectors];
    float* out[kMaxGroupVectors];
    int n_keys[kMaxGroupVectors];
    for (size_t it = begin; it < end; ++it) {
      const Item& item = items[it];
      const AttentionBlock& b = blocks[item.block];
      QueryGroup qg;
      qg.n = item.v1 - item.v0;
      for (int r = 0; r < qg.n; ++r) {
        const int vec = item.v0 + r, i = vec / group, h = item.kv_head * group + vec % group;
        q[r] = b.q + i * b.q_stride + static_cast<int64_t>(h) * head_dim;
        out[r] = b.out + i * b.out_stride + static_cast<int64_t>(h) * head_dim;
        n_keys[r] = b.causal ? b.start_pos + i + 1 : b.start_pos + b.n_q;
      }
      qg.q = q;
      qg.out = out;
      qg.n_keys = n_keys;
      qg.k = b.k + item.kv_head * b.kv_head_stride;
      qg.v = b.v + item.kv_head * b.kv_head_stride;
      qg.head_dim = head_dim;
      qg.scale = scale;
      qg.block_ids = b.block_ids;
      qg.block_stride = b.block_stride;
      qg.page_size = b.page_size;
      qg.k16 = b.k_bf16 ? b.k_bf16 + item.kv_head * b.kv_head_stride : nullptr;
      qg.v16 = b.k_bf16 ? b.v_bf16 + item.kv_head * b.kv_head_stride : nullptr;
      const bool grouped = qg.k16 ? kern16 != nullptr : kern != nullptr;
      const size_t need = grouped ? group_scratch_floats(qg) : static_cast<size_t>(n_keys[qg.n - 1]);
      if (scratch.size() < need) scratch.resize(need);
      if (grouped) {
        if (qg.k16) attend_group(*kern16, qg, scratch.data());
        else attend_group(*kern, qg, scratch.data());
        continue;
      }
      if (qg.k16) {  // per row, the specification itself (gathering a paged cache first)
        const auto [rk, rv] = contiguous_kv(qg, qg.k16, qg.v16, n_keys[qg.n - 1]);
        for (int r = 0; r < qg.n; ++r)
          attend_row_bf16_reference(q[r], rk, rv, n_keys[r], head_dim, scale, scratch.data(), out[r]);
        continue;
      }
      const auto [rk, rv] = contiguous_kv(qg, qg.k, qg.v, n_keys[qg.n - 1]);  // the per-row cores read contiguous keys
      for (int r = 0; r < qg.n; ++r) {
        if (avx2_rows) attend_row_avx2(q[r], rk, rv, n_keys[r], head_dim, scale, scratch.data(), out[r]);
        else attend_row_scalar(q[r], rk, rv, n_keys[r], head_dim, scale, scratch.data(), out[r]);
      }
    }
  });
}

}  // namespace attention_detail

void attention_causal(const AttentionBlock* blocks, int n_blocks, int n_heads, int n_kv_heads, int head_dim,
                      float scale, ThreadPool* pool) {
  attention_detail::attention_isa(isa_level(), blocks, n_blocks, n_heads, n_kv_heads, head_dim, scale, pool);
}

}  // namespace dsinfer
