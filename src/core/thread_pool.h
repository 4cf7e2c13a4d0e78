// dsinfer core: a blocking thread pool for data-parallel kernels.
// Workers sleep on a condition variable between jobs (never spin): on machines where
// vCPUs are shared, spinning threads starve each other. parallel_for splits [0, n) into
// contiguous chunks whose boundaries depend only on n and the thread count, never on
// timing, so results are reproducible run to run.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsinfer {

class ThreadPool {
 public:
  // n_threads <= 0 means "all hardware threads".
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); the caller's thread takes
  // part. Chunks are at least `grain` items. Blocks until all chunks are done.
  // Not re-entrant: fn must not call parallel_for on the same pool.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

  // The process-wide pool used by kernels; sized on first use by set_global_threads
  // (default: hardware threads). A thread that installed an override (set_thread_pool)
  // gets its own pool instead: the engine's drafter thread runs kernels concurrently with
  // the stepping thread's target forward (--dflash-enable-async-prefetch), and a pool has
  // one caller at a time.
  static ThreadPool& global();
  static void set_global_threads(int n_threads);
  // This thread's pool for global() (nullptr: the process-wide one again).
  static void set_thread_pool(ThreadPool* pool);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_chunks_ = 0;
  size_t next_chunk_ = 0;
  size_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace dsinfer
