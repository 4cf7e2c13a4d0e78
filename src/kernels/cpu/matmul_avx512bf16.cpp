// dsinfer kernels: the native Bf16Dot rows kernel for matmul (compiled with the AVX-512
// flags plus -mavx512bf16; only called when cpu_features() reports AVX512_BF16).
//
// vdpbf16ps multiplies 32 BF16 pairs of x and W and adds them, two per lane, into the 16
// F32 partial sums: exactly step 1 of the canonical Bf16Dot order (matmul_internal.h), at
// twice the multiply-adds per instruction of the F32 fma and with no W conversion. x comes
// pre-rounded to BF16 (x_to_bf16_avx512, in matmul_avx512.cpp); the tiles, tails and
// reduction are the shared ones of matmul_avx512_common.h. MXCSR is set to FTZ | DAZ for
// the call so that the tree's additions flush as the specification says.
#include <immintrin.h>

// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*() (`__Y = __Y`),
// which -Wuninitialized reports at every inlined use; the values are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer::matmul_detail {
namespace {

struct NativeDot {
  using V = __m512bh;
  static V prep(__m512i v) { return (__m512bh)v; }
  static __m512 madd(__m512 p, V x, V w) { return _mm512_dpbf16_ps(p, x, w); }
};

// Tile shapes, chosen by measurement on Zen 5 (cache-hot 896x320, 320x896, 8192x320):
//  - m > 1: 5 x rows by 5 W rows = 25 accumulators + 5 W + 1 x registers. 4 x 6 was as
//    fast at m = 8 and 64 but ~8% slower at m = 9 (4 + 4 + a 1-row tile, against 5 + 4);
//    3 x 6, 5 x 4 and 6 x 4 lose on some m; tiles of 7 or more W rows run out of general
//    registers for the row pointers and ran at half speed.
//  - m == 1: 12 W rows per tile, as the F32 kernel: 6 to 12 were within noise cache-hot,
//    and from DRAM (1024x3072, 3072x1024, 151936x1024) 12 was 2-5% faster than 8.
constexpr int kDecodeC = 12;
constexpr int kR = 5;
constexpr int kC = 5;

}  // namespace

void bf16_rows_avx512bf16(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0,
                          int64_t j1, float* y, int64_t ldy) {
  FlushSubnormalsScope ftz;
  bf16_rows_impl<NativeDot, kDecodeC, kR, kC>(xb, ldx, m, w, j0, j1, y, ldy);
}

}  // namespace dsinfer::matmul_detail
