// dsinfer bench: the figures the kernel work is judged by, in one run (no framework).
//
//   bench_roofline [threads...]        (default: 1 2)
// For each thread count T: memory read bandwidth (membw.h), then BF16 matrix-vector
// throughput on the Qwen3-0.6B shapes with W always coming from DRAM (the call rotates
// through copies of W totalling >= 512 MiB, like a decode step walking all layers), as
// weight GB/s and as a fraction of the bandwidth; then time(m) / time(1) for m = 8 and 64
// on 1024x1024 and 3072x1024 (cold W, each x block reused from cache).
// Every figure is the best of many calls: on a shared machine a call that was not
// preempted is the one that shows what the code can do; the median is printed as well.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/membw.h"

namespace {

using dsinfer::DType;
using dsinfer::ThreadPool;
using dsinfer::WeightView;

struct Timing {
  double best_s, median_s;
  double best_cpu_s;  // calling thread's CPU time (equals wall time when not preempted)
};

// Best and median seconds per call of y[m, rows] = x · Wᵀ (BF16), cold W.
Timing time_matmul(int64_t rows, int64_t cols, int64_t m, ThreadPool& pool, int calls) {
  const size_t elems = static_cast<size_t>(rows * cols);
  const size_t bytes = elems * 2;
  const size_t copies = std::max<size_t>(2, ((size_t{512} << 20) + bytes - 1) / bytes);
  std::vector<uint16_t> w(elems * copies);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (size_t i = 0; i < elems; ++i) w[i] = dsinfer::f32_to_bf16(nd(rng));
  for (size_t c = 1; c < copies; ++c) std::memcpy(w.data() + c * elems, w.data(), bytes);
  std::vector<float> x(static_cast<size_t>(m * cols)), y(static_cast<size_t>(m * rows));
  for (auto& v : x) v = nd(rng);
  std::vector<double> t, tc;
  for (int i = 0; i < calls + 3; ++i) {
    WeightView v{w.data() + (i % copies) * elems, DType::BF16, rows, cols};
    timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    auto t0 = std::chrono::steady_clock::now();
    dsinfer::matmul(x.data(), m, v, y.data(), &pool);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    if (i >= 3) t.push_back(s), tc.push_back((c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec));
  }
  std::sort(t.begin(), t.end());
  std::sort(tc.begin(), tc.end());
  return {t.front(), t[t.size() / 2], tc.front()};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads;
  for (int i = 1; i < argc; ++i) threads.push_back(std::atoi(argv[i]));
  if (threads.empty()) threads = {1, 2};
  std::printf("cpu: %s, isa: %s\n", dsinfer::cpu_features().model_name.c_str(),
              dsinfer::isa_level_name(dsinfer::isa_level()));
  for (int T : threads) {
    ThreadPool pool(T);
    const double bw = dsinfer::measure_memory_bandwidth_gbs(T);
    std::printf("\n== threads=%d  membw %.1f GB/s\n", T, bw);
    const int64_t shapes[][2] = {{1024, 3072}, {3072, 1024}, {1024, 1024}, {151936, 1024}};
    for (auto& s : shapes) {
      const int calls = s[0] > 100000 ? 15 : 300;
      Timing r = time_matmul(s[0], s[1], 1, pool, calls);
      const double gb = static_cast<double>(s[0] * s[1]) * 2 / 1e9;
      std::printf("matvec BF16 %6lldx%-5lld  best %8.1f us  %5.1f GB/s (%3.0f%% of membw)   median %8.1f us  %5.1f GB/s"
                  "   [best caller-thread CPU time %8.1f us]\n",
                  static_cast<long long>(s[0]), static_cast<long long>(s[1]), r.best_s * 1e6, gb / r.best_s,
                  100 * gb / r.best_s / bw, r.median_s * 1e6, gb / r.median_s, r.best_cpu_s * 1e6);
    }
    for (int64_t rows : {1024, 3072}) {
      Timing t1 = time_matmul(rows, 1024, 1, pool, 200);
      std::printf("BF16 %lldx1024: m=1 %.1f us", static_cast<long long>(rows), t1.best_s * 1e6);
      for (int64_t m : {2, 4, 8, 16, 64}) {
        Timing tm = time_matmul(rows, 1024, m, pool, m >= 64 ? 40 : 100);
        std::printf(" | m=%lld %.1f us (x%.2f)", static_cast<long long>(m), tm.best_s * 1e6, tm.best_s / t1.best_s);
      }
      std::printf("\n");
    }
  }
  return 0;
}
