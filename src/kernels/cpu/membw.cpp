// dsinfer kernels: streaming read bandwidth measurement (see membw.h).
//
// Flow: allocate one large 2 MiB-aligned buffer (huge pages requested, so TLB misses do
// not hide the DRAM limit), first-touch it from the same threads that will read it, then
// read it `passes` times front to back in 64 MiB segments, all threads sharing each
// segment, and keep the fastest segment. Timing segments rather than whole passes keeps
// the figure stable on a shared machine (a 40 ms pass is almost always preempted somewhere,
// a ~1-2 ms segment often is not), while every segment still comes from DRAM: the buffer is
// far larger than the LLC and is walked in order. Each thread reads its slice with
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

constexpr size_t kAlign = size_t{2} << 20;     // 2 MiB: huge-page aligned
constexpr size_t kSegment = size_t{64} << 20;  // timed unit, see the file comment

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
  uint64_t out[8];  // (_mm512_reduce_add_epi64 trips a GCC 12 -Wuninitialized false positive)
  _mm512_storeu_si512(out, a0);
  uint64_t s = 0;
  for (uint64_t v : out) s += v;
  return s;
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
  check(bytes >= (size_t{64} << 20), "measure_memory_bandwidth_gbs: buffer must be >= 64 MiB");
  passes = std::max(passes, 1);
  bytes = (bytes + kSegment - 1) / kSegment * kSegment;
  char* buf = static_cast<char*>(std::aligned_alloc(kAlign, bytes));
  check(buf != nullptr, "measure_memory_bandwidth_gbs: cannot allocate buffer");
#ifdef MADV_HUGEPAGE
  madvise(buf, bytes, MADV_HUGEPAGE);  // a hint; fine if transparent huge pages are off
#endif
  ThreadPool pool(threads);
  const size_t n_threads = static_cast<size_t>(pool.size());
  const size_t n_segments = bytes / kSegment;
  // Thread t's part of a segment; multiples of 256 bytes so readers run whole iterations.
  auto part = [&](size_t t) { return kSegment / 256 * t / n_threads * 256; };
  std::vector<uint64_t> sums(n_threads);
  auto for_segment = [&](size_t seg, bool write) {
    char* s = buf + seg * kSegment;
    pool.parallel_for(n_threads, [&](size_t a, size_t b) {
      for (size_t t = a; t < b; ++t) {
        if (write) std::memset(s + part(t), 1, part(t + 1) - part(t));
        else sums[t] += read_slice(s + part(t), part(t + 1) - part(t));
      }
    });
  };
  // First touch from the threads that will read (page placement), then one untimed pass.
  for (size_t seg = 0; seg < n_segments; ++seg) for_segment(seg, true);
  for (size_t seg = 0; seg < n_segments; ++seg) for_segment(seg, false);
  double best = 0;
  for (int pass = 0; pass < passes; ++pass)
    for (size_t seg = 0; seg < n_segments; ++seg) {
      auto t0 = std::chrono::steady_clock::now();
      for_segment(seg, false);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(kSegment) / sec / 1e9);
    }
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  g_sink = total;
  std::free(buf);
  return best;
}

double measure_memory_bandwidth_gbs(int threads) {
  return measure_memory_bandwidth_gbs(threads, size_t{1} << 30, 5);
}

}  // namespace dsinfer
