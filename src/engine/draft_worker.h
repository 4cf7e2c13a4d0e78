// dsinfer engine: the drafter's own thread for --dflash-enable-async-prefetch.
//
// With async prefetch on, the engine splits its decoding requests into two cohorts that
// alternate: while the stepping thread runs the target forward that verifies one cohort,
// this worker runs the drafter pass that proposes the other cohort's next drafts. The
// worker owns a separate ThreadPool (installed as its thread's ThreadPool::global()), so
// the two forwards never share a pool. One job at a time: run() hands a job over and
// returns at once, wait() blocks until it is done and rethrows what it threw.
// The worker sleeps on a condition variable between jobs (never spins).
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/thread_pool.h"

namespace dsinfer {

class DraftWorker {
 public:
  // pool_threads: kernel threads of the drafter pass (>= 1).
  explicit DraftWorker(int pool_threads);
  ~DraftWorker();
  DraftWorker(const DraftWorker&) = delete;
  DraftWorker& operator=(const DraftWorker&) = delete;

  int pool_threads() const { return pool_threads_; }
  void run(std::function<void()> job);  // precondition: no job in flight (wait() was called)
  void wait();                          // no-op when no job was handed over

 private:
  void loop();

  int pool_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace dsinfer
