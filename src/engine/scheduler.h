// dsinfer engine: admission order of the batched engine's waiting queue
// (--dspark-scheduler-policy fcfs | hit-rate | latency-aware | hybrid). Pure functions:
// LLMEngine::admit() describes every waiting request as an AdmissionCandidate, asks for
// the order, then admits from the front while the KV pool has room (the first request
// that does not fit stops admission, so nobody overtakes it).
//
// Policies (higher score first; ties by arrival):
//   fcfs           priority, then arrival (no score);
//   hit-rate       priority + expected prefix-cache hit (cached prompt tokens / prompt tokens,
//                  BlockPool::peek_cached_tokens): shared prefixes run while they are cached;
//   latency-aware  priority + shortness, 1 / (1 + work / 64) with work = prefill tokens left +
//                  tokens still to generate: short requests first (lower mean latency);
//   hybrid         priority + the mean of the two terms.
// Ageing: the score policies add waited_steps / aging_steps (steps spent waiting since
// submission or preemption). Both policy terms lie in [0, 1], so a request that waited
// aging_steps * (1 + priority gap) steps longer than another ranks above it whatever the
// terms: a waiting request cannot be starved, it reaches the front and then admission
// waits for it. aging_steps <= 0 turns ageing off (tests show starvation then).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsinfer {

enum class SchedulerPolicy { Fcfs, HitRate, LatencyAware, Hybrid };

// "fcfs" | "hit-rate" | "latency-aware" | "hybrid"; Error naming --dspark-scheduler-policy.
SchedulerPolicy parse_scheduler_policy(const std::string& name);
const char* scheduler_policy_name(SchedulerPolicy p);

struct AdmissionCandidate {
  int priority = 0;
  uint64_t arrival = 0;       // submission order (request id)
  int64_t waited_steps = 0;   // engine steps spent in the waiting queue so far
  int prompt_tokens = 0;      // tokens the prefill would cover
  int cached_tokens = 0;      // of which the prefix cache holds now
  int work_tokens = 0;        // prefill tokens left + tokens still to generate
};

// The policy's score of one candidate (fcfs: priority only).
double admission_score(SchedulerPolicy policy, const AdmissionCandidate& c, int aging_steps);

// Indices of `cands` in admission order.
std::vector<size_t> admission_order(SchedulerPolicy policy, std::span<const AdmissionCandidate> cands, int aging_steps);

}  // namespace dsinfer
