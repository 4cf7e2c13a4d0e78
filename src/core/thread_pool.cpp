// dsinfer core: blocking thread pool (see thread_pool.h for the contract).
#include "core/thread_pool.h"

#include <algorithm>
#include <memory>

namespace dsinfer {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

static size_t chunk_begin(size_t n, size_t chunks, size_t c) { return n * c / chunks; }

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t chunks = std::min<size_t>(static_cast<size_t>(n_threads_), (n + grain - 1) / grain);
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    next_chunk_ = 0;
    chunks_done_ = 0;
    ++generation_;
  }
  cv_start_.notify_all();
  // The caller works too, taking chunks until none are left.
  for (;;) {
    size_t c;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_chunk_ >= job_chunks_) break;
      c = next_chunk_++;
    }
    fn(chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1));
    std::lock_guard<std::mutex> lk(mu_);
    if (++chunks_done_ == job_chunks_) cv_done_.notify_all();
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return chunks_done_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_start_.wait(lk, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < job_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < job_chunks_) {
      size_t c = next_chunk_++;
      const auto* fn = job_;
      size_t n = job_n_, chunks = job_chunks_;
      lk.unlock();
      (*fn)(chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1));
      lk.lock();
      if (++chunks_done_ == job_chunks_) cv_done_.notify_all();
    }
  }
}

namespace {
std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
int g_pool_threads = 0;
thread_local ThreadPool* t_pool_override = nullptr;
}  // namespace

void ThreadPool::set_thread_pool(ThreadPool* pool) { t_pool_override = pool; }

ThreadPool& ThreadPool::global() {
  if (t_pool_override) return *t_pool_override;
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(g_pool_threads);
  return *g_pool;
}

void ThreadPool::set_global_threads(int n_threads) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_pool_threads = n_threads;
  g_pool.reset();
}

}  // namespace dsinfer
