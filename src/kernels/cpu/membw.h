// dsinfer kernels: streaming memory read bandwidth of this machine, the denominator of
// the roofline that `bench-model` reports (decode streams every weight once per token, so
// tokens/s can be at most bandwidth / weight bytes).
#pragma once
#include <cstddef>

namespace dsinfer {

// Read bandwidth in GB/s (1e9 bytes/s) over a `bytes` buffer (default 1 GiB, far larger
// than any last-level cache; at least 64 MiB), read `passes` times (default 5) by
// `threads` threads of a private blocking ThreadPool (threads <= 0: all hardware threads)
// with the widest vector loads the CPU has. The buffer is read in 64 MiB segments, each
// split across the threads; the result is the fastest segment.
double measure_memory_bandwidth_gbs(int threads);
double measure_memory_bandwidth_gbs(int threads, size_t bytes, int passes);

}  // namespace dsinfer
