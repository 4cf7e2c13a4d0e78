// dsinfer harness: closed- and open-loop request scheduling (see scheduler.h).
#include "harness/scheduler.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "harness/stats.h"

namespace dsinfer::harness {

namespace {

struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestResult> results;
  int in_flight = 0, sent = 0, failed = 0;
  long long tokens = 0;

  void finish(RequestResult&& r) {
    std::lock_guard<std::mutex> lock(mu);
    --in_flight;
    if (!r.ok) ++failed;
    tokens += r.output_tokens;
    results.push_back(std::move(r));
    cv.notify_all();
  }
  Progress snapshot(double elapsed) {
    std::lock_guard<std::mutex> lock(mu);
    Progress p;
    p.done = static_cast<int>(results.size());
    p.failed = failed;
    p.in_flight = in_flight;
    p.sent = sent;
    p.output_tokens = tokens;
    p.elapsed_s = elapsed;
    return p;
  }
};

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

LevelRun run_level(const BaseUrl& url, const Workload& w, const RequestOptions& ro, const HttpOptions& ho,
                   const LoadPlan& plan, const std::function<void(const Progress&)>& on_progress) {
  if (w.items.empty()) throw Error("workload: no requests");
  if (plan.num_prompts <= 0 && plan.duration_s <= 0) throw Error("--num-prompts/--duration: give at least one");
  if (plan.request_rate <= 0 && plan.concurrency < 1) throw Error("--concurrency: must be >= 1");
  // Bodies are built up front so the send loop does no JSON work.
  std::vector<std::pair<std::string, std::string>> reqs;
  for (const WorkItem& it : w.items) reqs.emplace_back(request_path(it), request_body(it, w, ro));

  Shared sh;
  const double start = now_s();
  const auto time_left = [&] { return plan.duration_s <= 0 || now_s() - start < plan.duration_s; };
  std::atomic<int> next{0};
  // Claims the next request index, or -1 when the run is over.
  const auto claim = [&]() -> int {
    if (!time_left()) return -1;
    const int i = next.fetch_add(1);
    if (plan.num_prompts > 0 && i >= plan.num_prompts) return -1;
    std::lock_guard<std::mutex> lock(sh.mu);
    ++sh.in_flight;
    ++sh.sent;
    return i;
  };
  const auto send = [&](int i) {
    const auto& [path, body] = reqs[(plan.first_item + static_cast<size_t>(i)) % reqs.size()];
    sh.finish(run_streaming_request(url, path, body, ho, start));
  };

  std::atomic<bool> stop_progress{false};
  std::thread progress;
  if (on_progress)
    progress = std::thread([&] {
      while (!stop_progress) {
        std::unique_lock<std::mutex> lock(sh.mu);
        sh.cv.wait_for(lock, std::chrono::duration<double>(plan.progress_interval_s), [&] { return stop_progress.load(); });
        lock.unlock();
        on_progress(sh.snapshot(now_s() - start));
      }
    });

  std::vector<std::thread> threads;
  if (plan.request_rate <= 0) {
    for (int u = 0; u < plan.concurrency; ++u)
      threads.emplace_back([&] {
        for (int i = claim(); i >= 0; i = claim()) send(i);
      });
    for (auto& t : threads) t.join();
  } else {
    // Open loop: arrival k at the sum of k exponential gaps (seeded). A request whose
    // arrival finds `concurrency` requests in flight waits for one to end (the cap keeps
    // an overloaded server from exhausting the client's threads). Its latency is measured
    // from when it is sent, so a report of an open-loop run states the cap.
    Rng rng(plan.seed);
    double arrival = 0;
    for (int i = claim(); i >= 0; i = claim()) {
      arrival += rng.exponential(plan.request_rate);
      sleep_s(start + arrival - now_s());
      if (plan.concurrency > 0) {
        std::unique_lock<std::mutex> lock(sh.mu);
        sh.cv.wait(lock, [&] { return sh.in_flight <= plan.concurrency; });
      }
      threads.emplace_back([&, i] { send(i); });
      if (!time_left()) break;
    }
    for (auto& t : threads) t.join();
  }
  LevelRun run;
  run.wall_s = now_s() - start;
  stop_progress = true;
  sh.cv.notify_all();
  if (progress.joinable()) progress.join();
  if (on_progress) on_progress(sh.snapshot(run.wall_s));
  run.results = std::move(sh.results);
  return run;
}

std::string progress_line(const std::string& label, const Progress& p) {
  char buf[256];
  const double tps = p.elapsed_s > 0 ? static_cast<double>(p.output_tokens) / p.elapsed_s : 0.0;
  std::snprintf(buf, sizeof buf, "[%s] %d done, %d failed, %d in flight, %lld tok, %.1f tok/s, %.1f s", label.c_str(),
                p.done, p.failed, p.in_flight, p.output_tokens, tps, p.elapsed_s);
  return buf;
}

}  // namespace dsinfer::harness
