// dsinfer bench: matmul kernels and the memory-bandwidth roofline (Google Benchmark).
//
// BM_Membw/T        streaming read bandwidth with T threads (membw.h), counter GB/s.
// BM_Matmul/R/C/M/T/cold/prec
//                   y[M, R] = x[M, C] · Wᵀ with BF16 W [R, C] on a private T-thread pool,
//                   prec = 0: MatmulPrecision::F32, 1: Bf16Dot (matmul.h).
//                   Counter W_GB/s = weight bytes / time, the figure to hold against
//                   BM_Membw: decode (M = 1) streams W once per token. cold = 1 rotates
//                   through enough copies of W (>= 512 MiB) that every call reads W from
//                   DRAM, as in a real decode step where all layers' weights pass through
//                   the cache; cold = 0 reuses one copy (cache-hot when it fits the LLC).
// Ratios time(M = 8) / time(M = 1) show the register blocking over x rows at work.
// Use --benchmark_repetitions=N: the min/max statistics filter out noise from other
// processes on a shared machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/membw.h"

namespace dsinfer {
namespace {

ThreadPool& pool_for(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

double vmin(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double vmax(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

void BM_Membw(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  double gbs = 0;
  for (auto _ : st) gbs = measure_memory_bandwidth_gbs(threads);
  st.counters["GB/s"] = gbs;
}
BENCHMARK(BM_Membw)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime()
    ->ComputeStatistics("min", vmin)->ComputeStatistics("max", vmax);

void BM_Matmul(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1), m = st.range(2);
  const int threads = static_cast<int>(st.range(3));
  const bool cold = st.range(4) != 0;
  const MatmulPrecision prec = st.range(5) != 0 ? MatmulPrecision::Bf16Dot : MatmulPrecision::F32;
  const size_t bytes = static_cast<size_t>(rows * cols) * 2;
  const size_t copies = cold ? std::max<size_t>(1, ((size_t{512} << 20) + bytes - 1) / bytes) : 1;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  // One random copy, replicated (content does not matter for speed, only that it is real
  // memory: every page is written).
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols) * copies);
  for (size_t i = 0; i < static_cast<size_t>(rows * cols); ++i) w[i] = f32_to_bf16(nd(rng));
  for (size_t c = 1; c < copies; ++c) std::memcpy(w.data() + c * rows * cols, w.data(), bytes);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(m * rows));
  ThreadPool& pool = pool_for(threads);
  size_t c = 0;
  const MatmulPrecision saved = matmul_precision();
  set_matmul_precision(prec);
  // Where matmul runs on AMX, each copy also gets the AMX layout, as WeightStore makes at
  // load (the kernel then reads only that).
  std::vector<uint16_t> packed;
  const WeightView probe{w.data(), DType::BF16, rows, cols};
  const int64_t pe = amx_wants(probe) ? amx_pack_elems(probe) : 0;
  packed.resize(static_cast<size_t>(pe) * copies + 32);
  uint16_t* pbase = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64 / 2;
  if (pe) {
    amx_pack(probe, pbase);
    for (size_t k = 1; k < copies; ++k) std::memcpy(pbase + k * pe, pbase, static_cast<size_t>(pe) * 2);
  }
  for (auto _ : st) {
    WeightView v{w.data() + c * rows * cols, DType::BF16, rows, cols};
    if (pe) v.amx_panels = pbase + c * pe;
    matmul(x.data(), m, v, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    c = (c + 1) % copies;
  }
  set_matmul_precision(saved);
  // Rates in units of 1e9 per second.
  st.counters["W_GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(rows * cols * m) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "m", "thr", "cold", "prec"});
  for (int thr : {1, 2})
    for (int prec : {0, 1}) {
      // Decode: the shapes of Qwen3-0.6B (down_proj, gate/up_proj, lm_head), DRAM-cold.
      b->Args({1024, 3072, 1, thr, 1, prec});
      b->Args({3072, 1024, 1, thr, 1, prec});
      b->Args({151936, 1024, 1, thr, 1, prec});
      // Batch ratios: m = 1, 8, 64 for 1024x1024 and 3072x1024, hot and cold.
      for (int64_t rows : {1024, 3072})
        for (int cold : {0, 1})
          for (int64_t m : {1, 2, 4, 8, 16, 64}) b->Args({rows, 1024, m, thr, cold, prec});
      // The embedded 12M target (H = 320, I = 896, V = 8192): cache-hot, verify-block sizes.
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{896, 320}, {320, 896}, {8192, 320}})
        for (int64_t m : {1, 5, 6, 7, 8, 9, 64}) b->Args({rows, cols, m, thr, 0, prec});
      // The same shapes DRAM-cold, as a decode or verify step meets them (the 24 MB of
      // weights stream from memory every forward).
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1792, 320}, {320, 896}, {8192, 320}})
        for (int64_t m : {1, 2, 4, 6, 8}) b->Args({rows, cols, m, thr, 1, prec});
    }
}
BENCHMARK(BM_Matmul)->Apply(matmul_args)->Unit(benchmark::kMicrosecond)->UseRealTime()
    ->ComputeStatistics("min", vmin)->ComputeStatistics("max", vmax);

}  // namespace
}  // namespace dsinfer

BENCHMARK_MAIN();
