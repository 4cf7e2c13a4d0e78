// dsinfer kernels: internals of attention shared by the per-ISA files, the tests and the
// benchmark.
//
// Data flow: attention_isa() (attention.cpp) cuts every (block, KV head) into work items of
// at most kMaxGroupVectors query vectors: vector r = row i * group + head-in-group, so the
// group's heads of one row sit side by side and key counts are nondecreasing in r. A work
// item is a QueryGroup; one thread attends it in four passes, with key blocks of about
// 32 KB so the K (then V) rows being reused stay in L1:
//   1. scores s[r][j] = (q_r·k_j) * scale, tiles of GroupKernels::score_tile vectors: each
//      key row is loaded once per tile and multiplied into every vector's accumulators;
//   2. per vector, exp_shifted_sum_avx2 (or its AVX-512 twin) over its own keys: the
//      softmax numerators, in place;
//   3. out_r = sum_j p[r][j] v_j, tiles of value_tile vectors: each value row is loaded once
//      and fma'd into every vector's accumulators. A tile first takes the keys all of its
//      vectors see, then the longer vectors continue alone (causal rows differ by one key
//      per row), always in ascending key order; accumulators go through out_r between key
//      blocks (a store and reload is exact);
//   4. out_r *= 1 / sum_r.
// At decode the K/V rows come from DRAM (the layer's weights evicted them since the last
// token) and the passes are latency-bound: the first tile over a key block prefetches
// the rows it will read a few keys ahead, the later tiles find them in L1.
//
// Bit-exactness with attend_row_avx2 (for head_dim % 8 == 0; other sizes run it per row):
//  - a score is the same two 8-lane fma chains over head_dim (chunks 0, 2, 4, ... and
//    1, 3, 5, ...), added, reduced as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), times scale.
//    On AVX-512 one zmm chain over 16-float steps holds exactly those two chains (low and
//    high halves), hence that kernel needs head_dim % 16 == 0 (else the AVX2 one runs);
//  - the softmax is the same function (or its bit-identical AVX-512 twin) on the same scores;
//  - each output lane is fma(p_j, v_j[lane], acc) for j = 0, 1, ... from acc = +0, then
//    times 1/sum: lane-wise, so the vector width and the tiling do not change it. Keys a
//    vector does not see are never folded in with p = 0: fma(0, v, acc) is not always acc
//    (a -0 acc becomes +0, an inf or NaN v poisons it).
//
// BF16 K/V (QueryGroup::k16): the same four passes with GroupKernelsBf16. attend_group()
// first rounds each query vector to BF16 (GroupKernelsBf16::round_q, zero-padded to a
// multiple of 32) into scratch, runs pass 1 with MXCSR's FTZ and DAZ set (the flushing of
// attend_row_bf16_reference's step 2; vdpbf16ps itself always flushes) and passes 2-4 with
// the caller's MXCSR. A score is one 16-lane vdpbf16ps chain over head_dim / 32 steps
// reduced by the same tree as the F32 path's (reduce8 on AVX-512), so the tiling and the
// paging change no bit; the values pass widens each BF16 value exactly and runs the F32
// path's fma chains.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"

namespace dsinfer::attention_detail {

// Software prefetch distance of the AVX2 and AVX-512 passes, in keys (4 KB of K or V rows at
// head_dim 64): measured best against DRAM-resident K/V (bench_attention cold = 1).
constexpr int kPrefetchKeys = 16;

// Prefetches (prefetcht0) every cache line of n elements of T from p.
template <class T>
inline void prefetch_rows(const T* p, int n) {
  constexpr int kPerLine = 64 / static_cast<int>(sizeof(T));
  for (int i = 0; i < n; i += kPerLine) __builtin_prefetch(p + i, 0, 3);
}

// Query vectors that read the same KV head, attended together.
struct QueryGroup {
  int n = 0;                        // number of query vectors, 1..kMaxGroupVectors
  const float* const* q = nullptr;  // q[r]: head_dim floats
  float* const* out = nullptr;      // out[r]: head_dim floats (must not alias q)
  const int* n_keys = nullptr;      // vector r sees keys [0, n_keys[r]); >= 1, nondecreasing
  const float* k = nullptr;         // key j at k + j * head_dim, j < n_keys[n - 1]
  const float* v = nullptr;         // value j at v + j * head_dim
  int head_dim = 0;
  float scale = 1.0f;
  // Paged (block_ids != nullptr): key j at k + block_ids[j / page_size] * block_stride +
  // (j % page_size) * head_dim (k, v already offset to the KV head); attend_group() calls
  // the micro-kernels once per run of keys inside one block.
  const int32_t* block_ids = nullptr;
  int64_t block_stride = 0;
  int page_size = 0;
  // BF16 cache (k16 != nullptr): keys and values are read from k16 / v16 instead of k / v,
  // with the same element offsets.
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
};

inline constexpr int kMaxGroupVectors = 48;

// The micro-kernels of one ISA; attend_group() (attention.cpp) drives them.
struct GroupKernels {
  int score_tile = 1;  // most vectors per scores() call
  int value_tile = 1;  // most vectors per values() call
  // s[r][j] for r < nq, j in [j0, j1): scores of query q[r] against key j.
  // prefetch: this is the first tile over these keys (they may still be in DRAM), so
  // software-prefetch the key rows a little ahead of the loads.
  void (*scores)(int nq, const float* const* q, const float* k, int j0, int j1, int head_dim, float scale,
                 float* const* s, bool prefetch);
  // out[r] = (zero ? 0 : out[r]) + sum over j in [j0, j1), ascending, of p[r][j] * v_j.
  void (*values)(int nq, const float* const* p, const float* v, int j0, int j1, int head_dim, float* const* out,
                 bool zero, bool prefetch);
  // exp_shifted_sum_avx2 or a bit-identical equivalent (softmax.h).
  float (*exp_sum)(const float* x, float* e, int64_t n);
  // out[i] *= inv for i < head_dim.
  void (*scale_out)(float* out, int head_dim, float inv);
};

const GroupKernels& group_kernels_avx2();    // head_dim % 8 == 0
const GroupKernels& group_kernels_avx512();  // head_dim % 16 == 0

// The micro-kernels over a BF16 cache (head_dim % 32 == 0); the meaning of every member is
// GroupKernels', with BF16 keys/values and BF16 query vectors qb (round_q's output).
struct GroupKernelsBf16 {
  int score_tile = 1;
  int value_tile = 1;
  // Called with MXCSR's FTZ and DAZ set (attend_group does it).
  void (*scores)(int nq, const uint16_t* const* qb, const uint16_t* k, int j0, int j1, int head_dim, float scale,
                 float* const* s, bool prefetch);
  void (*values)(int nq, const float* const* p, const uint16_t* v, int j0, int j1, int head_dim, float* const* out,
                 bool zero, bool prefetch);
  float (*exp_sum)(const float* x, float* e, int64_t n);
  void (*scale_out)(float* out, int head_dim, float inv);
  // qb[0, head_dim) = kv_round_bf16(q), qb[head_dim, pad32(head_dim)) = 0.
  void (*round_q)(const float* q, int head_dim, uint16_t* qb);
};

const GroupKernelsBf16& group_kernels_bf16_avx512();      // AVX-512F emulation of vdpbf16ps
const GroupKernelsBf16& group_kernels_bf16_avx512bf16();  // native vdpbf16ps (AVX512_BF16)
// Shared by both (attention_avx512.cpp).
void values_bf16_avx512(int nq, const float* const* p, const uint16_t* v, int j0, int j1, int head_dim,
                        float* const* out, bool zero, bool prefetch);
void round_q_bf16_avx512(const float* q, int head_dim, uint16_t* qb);
void scale_out_avx512(float* out, int head_dim, float inv);
void kv_round_bf16_avx512(const float* src, int64_t n, uint16_t* dst);

// Which BF16-cache kernel attention_isa() may use at IsaLevel::Avx512 (tests force the
// emulation on a CPU that has the instruction).
enum class Bf16Kernel { Native, Emulated };

// The best level this CPU can run, ignoring DSINFER_ISA (tests iterate up to it).
IsaLevel hardware_isa_level();

// Floats of scratch attend_group() needs for g.
size_t group_scratch_floats(const QueryGroup& g);
// Attends every vector of g with the kernels `kern` (scratch: group_scratch_floats(g)).
void attend_group(const GroupKernels& kern, const QueryGroup& g, float* scratch);
// The same over a BF16 cache (g.k16 / g.v16 set).
void attend_group(const GroupKernelsBf16& kern, const QueryGroup& g, float* scratch);

// attention_causal() with an explicit ISA level (lowered to what the CPU can run) instead
// of isa_level(), and an explicit cap on the vectors of one work item; tests use it to
// compare paths in one process (DSINFER_ISA is read only once) and to force small blocks
// to be split across work items and threads.
void attention_isa(IsaLevel isa, const AttentionBlock* blocks, int n_blocks, int n_heads, int n_kv_heads,
                   int head_dim, float scale, ThreadPool* pool, int max_vectors = kMaxGroupVectors,
                   Bf16Kernel bf16_kernel = Bf16Kernel::Native);

}  // namespace dsinfer::attention_detail
