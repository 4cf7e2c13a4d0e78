// Admission-order policies (engine/scheduler.h) and their use by the batched engine:
//  - the orders each policy gives on hand-made candidates (priority, hit, shortness, ties);
//  - ageing: a request that waited long enough ranks first under every score policy;
//  - in the engine, a request that never hits the prefix cache, submitted into a steady
//    stream of cache-hitting requests under hit-rate, is admitted after a bounded number
//    of them with ageing, and starves until the stream ends without it;
//  - bad policy names are one-line errors naming the flag.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model_test_util.h"

using namespace dsinfer;

TEST(Scheduler, PolicyOrders) {
  // 0: no hit, long; 1: full hit, long; 2: no hit, short; 3: higher priority, nothing else.
  const std::vector<AdmissionCandidate> c = {
      {0, 1, 0, 100, 0, 300}, {0, 2, 0, 100, 96, 204}, {0, 3, 0, 10, 0, 20}, {1, 4, 0, 100, 0, 300}};
  EXPECT_EQ(admission_order(SchedulerPolicy::Fcfs, c, 64), (std::vector<size_t>{3, 0, 1, 2}));
  EXPECT_EQ(admission_order(SchedulerPolicy::HitRate, c, 64), (std::vector<size_t>{3, 1, 0, 2}));
  EXPECT_EQ(admission_order(SchedulerPolicy::LatencyAware, c, 64), (std::vector<size_t>{3, 2, 1, 0}));
  const std::vector<size_t> hybrid = admission_order(SchedulerPolicy::Hybrid, c, 64);
  EXPECT_EQ(hybrid[0], 3u);
  EXPECT_EQ(hybrid[3], 0u);  // neither cached nor short
}

TEST(Scheduler, AgeingOvertakesEveryTerm) {
  // A long uncached request that waited 2 * aging_steps beats a fresh, fully cached, short one.
  const AdmissionCandidate old_one{0, 1, 128, 500, 0, 600};
  const AdmissionCandidate fresh{0, 2, 0, 16, 16, 1};
  for (SchedulerPolicy p : {SchedulerPolicy::HitRate, SchedulerPolicy::LatencyAware, SchedulerPolicy::Hybrid}) {
    const std::vector<AdmissionCandidate> c = {fresh, old_one};
    EXPECT_EQ(admission_order(p, c, 64)[0], 1u) << scheduler_policy_name(p);
    EXPECT_EQ(admission_order(p, c, 0)[0], 0u) << scheduler_policy_name(p) << " without ageing";
  }
}

TEST(Scheduler, BadPolicyNameIsAnError) {
  EXPECT_EQ(parse_scheduler_policy("hit-rate"), SchedulerPolicy::HitRate);
  try {
    parse_scheduler_policy("lifo");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dspark-scheduler-policy"), std::string::npos) << e.what();
  }
}

namespace {

// Position (0-based, in finishing order) at which the uncached request finished among a
// stream of `stream` cache-hitting requests, one submitted per step, one running at a time.
int finish_rank_of_uncached(SchedulerPolicy policy, int aging_steps) {
  static test::TempDir dir;
  static std::unique_ptr<Model> model = [] {
    write_random_model(random_model_preset("tiny"), DType::F32, dir.path, 3);
    return load_model(dir.path);
  }();
  EngineOptions o;
  o.max_running = 1;
  o.max_model_len = 96;
  o.kv_block_size = 8;
  o.scheduler_policy = policy;
  o.scheduler_aging_steps = aging_steps;
  std::vector<int32_t> prefix(40);
  for (size_t i = 0; i < prefix.size(); ++i) prefix[i] = 10 + static_cast<int32_t>(i);
  o.cache_warmup_prompts = {prefix};
  LLMEngine engine(*model, o);
  std::vector<uint64_t> finished;
  auto submit = [&](std::vector<int32_t> prompt) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.stop.max_tokens = 2;
    r.on_event = [&](const RequestEvent& ev) {
      if (ev.finished) finished.push_back(ev.id);
    };
    return engine.submit(std::move(r));
  };
  auto hitting = [&](int k) {
    std::vector<int32_t> p = prefix;
    p.push_back(500 + k);
    return p;
  };
  std::vector<int32_t> lone(41);
  for (size_t i = 0; i < lone.size(); ++i) lone[i] = 700 + static_cast<int32_t>(i);
  const uint64_t x = submit(lone);
  const int stream = 60;
  for (int k = 0; k < stream; ++k) {
    submit(hitting(k));
    engine.step();
  }
  engine.run_until_idle();
  EXPECT_EQ(finished.size(), static_cast<size_t>(stream + 1));
  EXPECT_EQ(engine.check_kv_invariants(), "");
  return static_cast<int>(std::find(finished.begin(), finished.end(), x) - finished.begin());
}

}  // namespace

TEST(Scheduler, AgeingPreventsStarvationInTheEngine) {
  // Without ageing, hit-rate keeps choosing the cached stream: the lone request ends last.
  EXPECT_EQ(finish_rank_of_uncached(SchedulerPolicy::HitRate, 0), 60);
  // With ageing it overtakes requests that arrived 8+ steps after it: admitted early.
  const int aged = finish_rank_of_uncached(SchedulerPolicy::HitRate, 8);
  EXPECT_LE(aged, 12);
  EXPECT_LE(finish_rank_of_uncached(SchedulerPolicy::Hybrid, 8), 20);
  // fcfs: by arrival, it is first.
  EXPECT_EQ(finish_rank_of_uncached(SchedulerPolicy::Fcfs, 8), 0);
}
