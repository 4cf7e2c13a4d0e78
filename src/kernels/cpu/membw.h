// dsinfer kernels: streaming memory read bandwidth of this machine, the denominator of
// the roofline that `bench-model` reports (decode streams every weight once per token, so
// tokens/s can be at most bandwidth / weight bytes).
#pragma once
#include <cstddef>

namespace dsinfer {

// Best-of-`passes` read bandwidth in GB/s (1e9 bytes/s) over a `bytes` buffer (default
// 1 GiB, far larger than any last-level cache), read by `threads` threads of a private
// blocking ThreadPool (threads <= 0: all hardware threads), each streaming one contiguous
// slice with the widest vector loads the CPU has.
double measure_memory_bandwidth_gbs(int threads);
double measure_memory_bandwidth_gbs(int threads, size_t bytes, int passes);

}  // namespace dsinfer
