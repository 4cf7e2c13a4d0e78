// dsinfer engine: the drafter's own thread (see draft_worker.h).
#include "engine/draft_worker.h"

#include <algorithm>

namespace dsinfer {

DraftWorker::DraftWorker(int pool_threads) : pool_threads_(std::max(1, pool_threads)) {
  thread_ = std::thread([this] { loop(); });
}

DraftWorker::~DraftWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DraftWorker::run(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = std::move(job);
    busy_ = true;
    error_ = nullptr;
  }
  cv_.notify_all();
}

void DraftWorker::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !busy_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void DraftWorker::loop() {
  // The pool lives on this thread: its kernels never meet the stepping thread's pool.
  ThreadPool pool(pool_threads_);
  ThreadPool::set_thread_pool(&pool);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (busy_ && job_); });
    if (stop_) break;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lk.unlock();
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    error_ = err;
    busy_ = false;
    cv_.notify_all();
  }
  ThreadPool::set_thread_pool(nullptr);
}

}  // namespace dsinfer
