// Soak test of the batched engine on the paged KV pool: many requests with random prompt
// and output lengths, shared prefixes, priorities, stop ids, cancellations at random steps
// and a pool far too small for them (admission control, preemption, eviction and
// copy-on-write all run constantly), on a tiny random Qwen3 (so it runs in seconds, also
// under ASan). Checks:
//  - every request ends exactly once; greedy outputs equal single-request plain greedy
//    decoding on the dense cache (`generate`); a cancelled request's output is a prefix of
//    it; some requests were preempted;
//  - the pool's invariants hold every few steps, and at the end every block is back
//    (free or an idle cache entry).
// Plain decoding, the n-gram drafter (speculation with rollbacks), and the n-gram drafter
// with async prefetch (its passes on the DraftWorker thread). Size: 300 requests (100 per
// mode); DSINFER_SOAK_REQUESTS=2000 runs the full soak.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "engine/generator.h"
#include "engine/llm_engine.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model_test_util.h"
#include "spec/ngram_drafter.h"

using namespace dsinfer;

namespace {

int soak_requests() {
  const char* env = std::getenv("DSINFER_SOAK_REQUESTS");
  const int n = env ? std::atoi(env) : 200;
  return n > 1 ? n : 200;
}

struct SoakRequest {
  std::vector<int32_t> prompt;
  StopConditions stop;
  int priority = 0;
  int cancel_after = -1;  // steps after submission; -1: never
  std::vector<int32_t> plain;
};

Model& tiny_model() {
  static test::TempDir dir;
  static std::unique_ptr<Model> model = [] {
    write_random_model(random_model_preset("tiny"), DType::F32, dir.path, 7);
    return load_model(dir.path);
  }();
  return *model;
}

void soak(const Drafter* drafter, int n, uint32_t seed, const std::string& what, bool async_prefetch = false) {
  Model& model = tiny_model();
  const int V = model.config().vocab_size;
  std::mt19937 rng(seed);
  auto random_tokens = [&](int len) {
    std::vector<int32_t> t(static_cast<size_t>(len));
    for (auto& x : t) x = 3 + static_cast<int32_t>(rng() % static_cast<uint32_t>(V - 3));
    return t;
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 6; ++i) prefixes.push_back(random_tokens(4 + static_cast<int>(rng() % 37)));
  std::vector<SoakRequest> reqs(static_cast<size_t>(n));
  for (SoakRequest& r : reqs) {
    if (rng() % 4 != 0) r.prompt = prefixes[rng() % prefixes.size()];
    for (int32_t t : random_tokens(1 + static_cast<int>(rng() % 40))) r.prompt.push_back(t);
    r.stop.max_tokens = 1 + static_cast<int>(rng() % 40);
    // A frequent stop id on some requests, so some end early with "stop".
    if (rng() % 3 == 0) r.stop.stop_ids = {static_cast<int32_t>(rng() % static_cast<uint32_t>(V))};
    r.priority = static_cast<int>(rng() % 3);
    if (rng() % 8 == 0) r.cancel_after = static_cast<int>(rng() % 30);
    r.plain = generate(model, nullptr, r.prompt, SamplingParams{}, r.stop).ids;
  }

  EngineOptions o;
  o.max_running = 10;
  o.max_batch_tokens = 48;
  o.max_model_len = 128;
  o.kv_block_size = 4;
  o.kv_num_blocks = 64;  // one request needs up to 23 blocks; ten of them would need ~200
  o.shard_count = 3;
  o.enable_cache_defrag = true;
  o.drafter = drafter;
  o.async_prefetch = async_prefetch;  // drafter passes on the DraftWorker thread
  LLMEngine engine(model, o);

  std::map<uint64_t, size_t> index;
  std::vector<std::vector<int32_t>> got(reqs.size());
  std::vector<std::string> reason(reqs.size());
  std::vector<int> finished(reqs.size(), 0);
  std::multimap<int, uint64_t> cancels;  // step -> id
  size_t next = 0;
  int step = 0;
  while (true) {
    // Arrivals in random bursts while the engine runs.
    for (int k = static_cast<int>(rng() % 4); k > 0 && next < reqs.size(); --k, ++next) {
      EngineRequest er;
      er.prompt = reqs[next].prompt;
      er.stop = reqs[next].stop;
      er.priority = reqs[next].priority;
      const size_t i = next;
      er.on_event = [&, i](const RequestEvent& ev) {
        got[i].insert(got[i].end(), ev.new_ids.begin(), ev.new_ids.end());
        if (ev.finished) {
          reason[i] = ev.finish_reason;
          finished[i]++;
        }
      };
      const uint64_t id = engine.submit(std::move(er));
      index[id] = i;
      if (reqs[i].cancel_after >= 0) cancels.insert({step + reqs[i].cancel_after, id});
    }
    for (auto it = cancels.begin(); it != cancels.end() && it->first <= step;) {
      engine.cancel(it->second);
      it = cancels.erase(it);
    }
    const bool worked = engine.step();
    ++step;
    if (step % 16 == 0) {
      const std::string inv = engine.check_kv_invariants();
      ASSERT_EQ(inv, "") << what << " at step " << step;
    }
    if (!worked && next == reqs.size() && cancels.empty()) break;
    ASSERT_LT(step, 200 * n) << what << ": the engine does not drain";
  }

  int cancelled = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(finished[i], 1) << what << ": request " << i;
    if (reason[i] == "cancelled") {
      ++cancelled;
      ASSERT_LE(got[i].size(), reqs[i].plain.size()) << what << ": request " << i;
      EXPECT_TRUE(std::equal(got[i].begin(), got[i].end(), reqs[i].plain.begin())) << what << ": request " << i;
    } else {
      EXPECT_EQ(got[i], reqs[i].plain) << what << ": request " << i << " (" << reason[i] << ")";
    }
  }
  const EngineStats st = engine.stats();
  EXPECT_GT(cancelled, 0) << what;
  EXPECT_GT(st.preemptions, 0u) << what;
  EXPECT_GT(st.kv_pool.hit_ratio, 0.0) << what;
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_pool.used, 0) << what;
  EXPECT_EQ(st.kv_pool.free + st.kv_pool.cached_idle, st.kv_pool.total) << what;
  EXPECT_EQ(engine.check_kv_invariants(), "") << what;
  if (drafter) {
    EXPECT_GT(st.accepted_draft_tokens, 0u) << what;
  }
  std::fprintf(stderr, "%s: %d requests, %d steps, %d cancelled, %llu preemptions, hit ratio %.2f\n", what.c_str(), n,
               step, cancelled, static_cast<unsigned long long>(st.preemptions), st.kv_pool.hit_ratio);
}

}  // namespace

TEST(PagedEngineSoak, PlainDecodingUnderKVPressure) { soak(nullptr, soak_requests() / 2, 1, "plain"); }

TEST(PagedEngineSoak, NgramSpeculationUnderKVPressure) {
  NgramOptions no;
  no.max_draft_tokens = 4;
  const NgramDrafter ngram(no);
  soak(&ngram, soak_requests() - soak_requests() / 2, 2, "ngram");
}

TEST(PagedEngineSoak, NgramAsyncPrefetchUnderKVPressure) {
  // The drafter thread proposes for one cohort while the forward, cancellations,
  // preemptions and defrags happen on the stepping thread (ASan in CI).
  NgramOptions no;
  no.max_draft_tokens = 4;
  const NgramDrafter ngram(no);
  soak(&ngram, soak_requests() / 2, 3, "ngram async prefetch", true);
}
