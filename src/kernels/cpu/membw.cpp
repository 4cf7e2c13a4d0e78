// dsinfer kernels: streaming read bandwidth measurement (see membw.h).
//
// Flow: allocate one large 2 MiB-aligned buffer (huge pages requested, so TLB misses do
// not hide the DRAM limit), first-touch it from the same threads and slices that will read
// it, then time `passes` full reads and keep the fastest. Each thread reads its slice with
// several independent vector accumulators so that the loop is limited by memory, not by
// add latency; the sum is stored to a volatile so the reads cannot be optimised away.
// The reader uses AVX-512 or AVX2 through function target attributes (this file is built
// for baseline x86-64) after a run-time check, with an SSE2 fallback.
#include "kernels/cpu/membw.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dsinfer {
namespace {

constexpr size_t kAlign = size_t{2} << 20;  // 2 MiB: huge-page aligned

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t read_avx512(const char* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(a0));
}

__attribute__((target("avx2"))) uint64_t read_avx2(const char* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t out[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), a0);
  return out[0] + out[1] + out[2] + out[3];
}

uint64_t read_sse2(const char* p, size_t n) {
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm_add_epi64(a0, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i)));
    a1 = _mm_add_epi64(a1, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i + 16)));
    a2 = _mm_add_epi64(a2, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i + 32)));
    a3 = _mm_add_epi64(a3, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i + 48)));
  }
  a0 = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
  uint64_t out[2];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), a0);
  return out[0] + out[1];
}
#endif

uint64_t read_slice(const char* p, size_t n) {
#if defined(__x86_64__)
  const auto& f = cpu_features();
  if (f.avx512f && isa_level() == IsaLevel::Avx512) return read_avx512(p, n);
  if (f.avx2 && isa_level() >= IsaLevel::Avx2) return read_avx2(p, n);
  return read_sse2(p, n);
#else
  uint64_t s = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
#endif
}

volatile uint64_t g_sink;

}  // namespace

double measure_memory_bandwidth_gbs(int threads, size_t bytes, int passes) {
  check(bytes >= (size_t{1} << 20), "measure_memory_bandwidth_gbs: buffer must be >= 1 MiB");
  passes = std::max(passes, 1);
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  char* buf = static_cast<char*>(std::aligned_alloc(kAlign, bytes));
  check(buf != nullptr, "measure_memory_bandwidth_gbs: cannot allocate buffer");
#ifdef MADV_HUGEPAGE
  madvise(buf, bytes, MADV_HUGEPAGE);  // a hint; fine if transparent huge pages are off
#endif
  ThreadPool pool(threads);
  const size_t n_threads = static_cast<size_t>(pool.size());
  // Slices are multiples of 256 bytes so every reader runs whole unrolled iterations.
  auto slice = [&](size_t t) { return bytes / 256 * t / n_threads * 256; };
  pool.parallel_for(n_threads, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) std::memset(buf + slice(t), 1, slice(t + 1) - slice(t));
  });
  std::vector<uint64_t> sums(n_threads);
  double best = 0;
  for (int pass = 0; pass < passes + 1; ++pass) {  // pass 0 warms up (page tables, clocks)
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n_threads, [&](size_t a, size_t b) {
      for (size_t t = a; t < b; ++t) sums[t] = read_slice(buf + slice(t), slice(t + 1) - slice(t));
    });
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t s = 0;
    for (uint64_t v : sums) s += v;
    g_sink = s;
    if (pass > 0) best = std::max(best, static_cast<double>(bytes) / sec / 1e9);
  }
  std::free(buf);
  return best;
}

double measure_memory_bandwidth_gbs(int threads) {
  return measure_memory_bandwidth_gbs(threads, size_t{1} << 30, 5);
}

}  // namespace dsinfer
