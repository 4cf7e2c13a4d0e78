// dsinfer bench: causal GQA attention, per-row vs grouped kernels (Google Benchmark).
//
// BM_Attention/ctx/nq/path/cold
//   One layer's attention of the embedded target (6 query heads, 2 KV heads, head_dim 64)
//   for a block of nq new rows whose last row sees ctx keys (nq = 1: decode, nq = 9: a
//   speculative verify block), on one thread. cold = 0: one K/V copy, cache-hot; cold = 1:
//   rotates through >= 256 MiB of K/V copies so every call reads K/V from DRAM, as in
//   real decoding, where the layer's weights evict its K/V between tokens.
//   path 0: the previous kernel, attend_row_avx2 once per (row, head), each re-reading
//           its KV head's whole K/V;
//   path 1: the grouped kernel at the AVX2 level; path 2: at the AVX-512 level (skipped
//           where the CPU lacks it). Bits are identical across the three.
//   path 3: a BF16 K/V cache (bf16 matmul precision), scores with AVX512_BF16 vdpbf16ps
//           (skipped without it); path 4: the same with its AVX-512F emulation. Bits are
//           identical between 3 and 4 (not to 0-2: K, V and q are rounded to BF16).
// Use --benchmark_repetitions=N: the min statistic filters out noise from other processes
// on a shared machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_internal.h"

namespace dsinfer {
namespace {

double vmin(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void BM_Attention(benchmark::State& st) {
  const int ctx = static_cast<int>(st.range(0)), n_q = static_cast<int>(st.range(1));
  const int path = static_cast<int>(st.range(2));
  constexpr int kHeads = 6, kKvHeads = 2, kDim = 64, kGroup = kHeads / kKvHeads;
  const IsaLevel isa = path >= 2 ? IsaLevel::Avx512 : IsaLevel::Avx2;
  if (attention_detail::hardware_isa_level() < isa || (path == 3 && !cpu_features().avx512bf16)) {
    st.SkipWithError("this CPU lacks the ISA level");
    return;
  }
  const bool bf16 = path >= 3;
  const size_t kv_floats = static_cast<size_t>(kKvHeads) * ctx * kDim;
  const size_t copies = st.range(3) ? std::max<size_t>(1, (size_t{256} << 20) / (2 * kv_floats * sizeof(float))) : 1;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  std::vector<float> k(kv_floats * copies), v(k.size());
  std::vector<float> q(static_cast<size_t>(n_q) * kHeads * kDim), out(q.size()), scores(ctx);
  for (auto* buf : {&k, &v, &q})
    for (auto& x : *buf) x = ud(rng);
  std::vector<uint16_t> k16(bf16 ? k.size() : 0), v16(k16.size());
  if (bf16) {
    kv_round_bf16(k.data(), static_cast<int64_t>(k.size()), k16.data());
    kv_round_bf16(v.data(), static_cast<int64_t>(v.size()), v16.data());
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  AttentionBlock b;
  b.q = q.data();
  b.q_stride = kHeads * kDim;
  b.n_q = n_q;
  b.start_pos = ctx - n_q;
  b.k = k.data();
  b.v = v.data();
  b.kv_head_stride = int64_t{ctx} * kDim;
  b.out = out.data();
  b.out_stride = kHeads * kDim;
  ThreadPool pool(1);
  size_t c = 0;
  for (auto _ : st) {
    b.k = k.data() + c * kv_floats;
    b.v = v.data() + c * kv_floats;
    if (bf16) {
      b.k_bf16 = k16.data() + c * kv_floats;
      b.v_bf16 = v16.data() + c * kv_floats;
    }
    c = (c + 1) % copies;
    if (path == 0) {
      for (int h = 0; h < kHeads; ++h)
        for (int i = 0; i < n_q; ++i)
          attend_row_avx2(b.q + i * b.q_stride + h * kDim, b.k + (h / kGroup) * b.kv_head_stride,
                          b.v + (h / kGroup) * b.kv_head_stride, b.start_pos + i + 1, kDim, scale, scores.data(),
                          b.out + i * b.out_stride + h * kDim);
    } else {
      attention_detail::attention_isa(isa, &b, 1, kHeads, kKvHeads, kDim, scale, &pool,
                                      attention_detail::kMaxGroupVectors,
                                      path == 4 ? attention_detail::Bf16Kernel::Emulated
                                                : attention_detail::Bf16Kernel::Native);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Attention)
    ->ArgNames({"ctx", "nq", "path", "cold"})
    ->ArgsProduct({{600, 2000}, {1, 6, 9}, {0, 1, 2, 3, 4}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", vmin);

}  // namespace
}  // namespace dsinfer

BENCHMARK_MAIN();
