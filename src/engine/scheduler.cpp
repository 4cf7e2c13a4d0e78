// dsinfer engine: admission-order policies (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace dsinfer {

SchedulerPolicy parse_scheduler_policy(const std::string& name) {
  if (name == "fcfs") return SchedulerPolicy::Fcfs;
  if (name == "hit-rate") return SchedulerPolicy::HitRate;
  if (name == "latency-aware") return SchedulerPolicy::LatencyAware;
  if (name == "hybrid") return SchedulerPolicy::Hybrid;
  throw Error("--dspark-scheduler-policy: unknown policy '" + name + "' (fcfs, hit-rate, latency-aware, hybrid)");
}

const char* scheduler_policy_name(SchedulerPolicy p) {
  switch (p) {
    case SchedulerPolicy::Fcfs: return "fcfs";
    case SchedulerPolicy::HitRate: return "hit-rate";
    case SchedulerPolicy::LatencyAware: return "latency-aware";
    case SchedulerPolicy::Hybrid: return "hybrid";
  }
  return "?";
}

double admission_score(SchedulerPolicy policy, const AdmissionCandidate& c, int aging_steps) {
  const double hit = c.prompt_tokens > 0 ? static_cast<double>(c.cached_tokens) / c.prompt_tokens : 0.0;
  const double shortness = 1.0 / (1.0 + std::max(0, c.work_tokens) / 64.0);
  double term = 0.0;
  switch (policy) {
    case SchedulerPolicy::Fcfs: return c.priority;
    case SchedulerPolicy::HitRate: term = hit; break;
    case SchedulerPolicy::LatencyAware: term = shortness; break;
    case SchedulerPolicy::Hybrid: term = 0.5 * (hit + shortness); break;
  }
  const double age = aging_steps > 0 ? static_cast<double>(c.waited_steps) / aging_steps : 0.0;
  return c.priority + term + age;
}

std::vector<size_t> admission_order(SchedulerPolicy policy, std::span<const AdmissionCandidate> cands, int aging_steps) {
  std::vector<double> score(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) score[i] = admission_score(policy, cands[i], aging_steps);
  std::vector<size_t> order(cands.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (score[a] != score[b]) return score[a] > score[b];
    return cands[a].arrival < cands[b].arrival;
  });
  return order;
}

}  // namespace dsinfer
