// dsinfer kernels: argmax over one row of logits, the greedy decision of every decode step,
// verify row and draft position (8 192 to 152 k floats each).
//
// Contract: the index of the first maximum under `>`, exactly the scalar loop
//   best = 0; for i in 1..n-1: if x[i] > x[best]: best = i
// for every input (ties, ±0, infinities, NaN included), so the vector path never changes a
// decision: it finds the maximum 16 lanes wide, then the first index that equals it; a row
// holding a NaN (where `>` is not a total order) takes the scalar loop.
#pragma once
#include <cstdint>

namespace dsinfer {

// n >= 1.
int32_t argmax_f32(const float* x, int64_t n);
// Per-ISA entry points (argmax_f32 dispatches on isa_level()).
int32_t argmax_f32_scalar(const float* x, int64_t n);
int32_t argmax_f32_avx512(const float* x, int64_t n);

}  // namespace dsinfer
