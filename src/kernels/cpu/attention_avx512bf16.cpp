// dsinfer kernels: the attention scores over a BF16 K/V cache with AVX512_BF16's vdpbf16ps
// (compiled with -mavx512bf16; attention_isa() calls it only where cpu_features() reports
// the instruction). One vdpbf16ps per 32 elements of head_dim per (query, key) pair: half
// the multiply instructions of the F32 path and half the K bytes. The values pass, the
// softmax and the query rounding are the AVX-512F ones (attention_avx512.cpp).
//
// Bits: vdpbf16ps adds the odd pair's product, then the even one's, each exactly and
// rounded once, flushing subnormal inputs and results; that is attend_row_bf16_reference's
// step (measured for matmul on Zen 5, matmul_internal.h), and the reduction is the
// emulation's reduce8 under the FTZ that attend_group() sets, so this kernel and the
// emulation give the same scores.
#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/attention_avx512_common.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/softmax.h"

namespace dsinfer::attention_detail {
namespace {

using namespace avx512;

struct NativeDot {
  using Q = __m512bh;
  static Q load_q(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static __m512i load_k(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static __m512 step(__m512 acc, const Q& q, __m512i k) { return _mm512_dpbf16_ps(acc, q, (__m512bh)k); }
};

// 3 query vectors x 8 keys: 24 accumulators + 3 query + 1 key registers.
constexpr int kScoreTile = 3;
constexpr int kValueTile = 4;

void scores_bf16(int nq, const uint16_t* const* qb, const uint16_t* k, int j0, int j1, int D, float scale,
                 float* const* s, bool prefetch) {
  switch (nq) {
    case 1: scores_bf16_tile<NativeDot, 1>(qb, k, j0, j1, D, scale, s, prefetch); break;
    case 2: scores_bf16_tile<NativeDot, 2>(qb, k, j0, j1, D, scale, s, prefetch); break;
    default: scores_bf16_tile<NativeDot, kScoreTile>(qb, k, j0, j1, D, scale, s, prefetch); break;
  }
}

}  // namespace

const GroupKernelsBf16& group_kernels_bf16_avx512bf16() {
  static const GroupKernelsBf16 k{kScoreTile,         kValueTile,       scores_bf16,        values_bf16_avx512,
                                  exp_shifted_sum_avx512, scale_out_avx512, round_q_bf16_avx512};
  return k;
}

}  // namespace dsinfer::attention_detail
