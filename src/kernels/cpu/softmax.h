// dsinfer kernels: numerically stable softmax over one row, in place:
// x[i] = exp(x[i] - max) / sum_j exp(x[j] - max).
// The reduction order depends only on n (8-lane partial sums, fixed horizontal order, then
// the scalar tail), never on the caller, so equal rows give equal bits.
#pragma once
#include <cstdint>

namespace dsinfer {

void softmax(float* x, int64_t n);
// Per-ISA entry points (softmax() dispatches on isa_level()).
void softmax_scalar(float* x, int64_t n);
void softmax_avx2(float* x, int64_t n);
// Writes e[i] = exp(x[i] - max) and returns sum e (what attention needs before it scales V).
float exp_shifted_sum_scalar(const float* x, float* e, int64_t n);
float exp_shifted_sum_avx2(const float* x, float* e, int64_t n);
// Bit-identical to exp_shifted_sum_avx2 (same max, same exp per lane, same 8-lane sum
// order) with the exponentials 16 wide; attention uses it on AVX-512 CPUs.
float exp_shifted_sum_avx512(const float* x, float* e, int64_t n);

}  // namespace dsinfer
