// The batched engine against the Model hooks a device model (the CUDA backend) uses, checked
// on the CPU so that CI covers them without a GPU: a wrapper around the embedded CPU target
// that says it runs on a device (Model::on_device), sizes its own KV pool
// (Model::device_kv_blocks) and makes the paged storage (Model::make_paged_kv_cache,
// counted). Asserted:
//  - the engine takes its KV storage from the model (one make_paged_kv_cache per engine)
//    and, given a budget, the block count from device_kv_blocks (capped, with a drafter, by
//    the host budget's share for the feature store);
//  - greedy steps use forward_argmax (ids only) and verification from those ids gives every
//    request its single-request plain greedy output, for plain decoding and with the DSpark
//    drafter (and with the lookup assist), whose shared LM head then runs through the
//    model's lm_head();
//  - a sampled request in the batch switches the step back to logit rows (no forward_argmax),
//    unless the model verifies on the device (model/device_verify.h, the CUDA model): then
//    the engine hands it one VerifyRequest per entry and takes (accepted, next token) back;
//    a host stand-in that runs verify_drafts there gives every request the tokens of the
//    plain CPU engine (plain, DSpark with its q rows, synthetic acceptance), with greedy
//    requests in the same steps;
//  - feature rows in the model's pool (ForwardBatch::capture_to_cache, the drafter reading
//    ContextBatchItem's cache source, as the CUDA model and GPU drafter do): a stand-in pool
//    on the host gives the tokens and acceptance of the engine's host feature store, with
//    prefix sharing, copy-on-write, preemption and defrag.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "engine/llm_engine.h"
#include "model/block_kv_cache.h"
#include "model/device_verify.h"
#include "model/model.h"
#include "model/paged_kv_cache.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/verify.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;

namespace {

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

// A CPU model that claims to be a device model: every call goes to the inner model; the
// stand-ins below override what they count or change.
class DelegatingDeviceModel : public Model {
 public:
  explicit DelegatingDeviceModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const override {
    return inner_.make_kv_cache(max_slots, max_tokens);
  }
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override {
    return inner_.make_paged_kv_cache(block_size, num_blocks, max_slots, max_tokens, feature_floats);
  }
  bool on_device() const override { return true; }
  void forward(KVCache& kv, const ForwardBatch& b, ForwardOutput& out) override {
    ++forwards;
    inner_.forward(kv, b, out);
  }
  void embed(const int32_t* ids, int n, float* out) const override { inner_.embed(ids, n, out); }
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override {
    inner_.lm_head(hidden, n, logits, apply_norm);
  }
  const WeightView* host_embedding() const override { return inner_.host_embedding(); }
  const WeightView* host_lm_head() const override { return inner_.host_lm_head(); }
  int forwards = 0;

 protected:
  Model& inner_;
};

// Sizes its own pool and reduces greedy steps to argmax ids, as the CUDA model does.
class DeviceLikeModel final : public DelegatingDeviceModel {
 public:
  using DelegatingDeviceModel::DelegatingDeviceModel;
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override {
    ++paged_made;
    return DelegatingDeviceModel::make_paged_kv_cache(block_size, num_blocks, max_slots, max_tokens, feature_floats);
  }
  int64_t device_kv_blocks(int, double, int) const override { return kDeviceBlocks; }
  void forward_argmax(KVCache& kv, const ForwardBatch& b, ForwardOutput& out, std::vector<int32_t>& ids) override {
    ++argmax_forwards;
    Model::forward_argmax(kv, b, out, ids);  // the host default: forward(), then argmax per row
    --forwards;                              // (not a logits step of its own)
    out.logits.clear();                      // as a device model leaves it
  }
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override {
    ++head_calls;
    DelegatingDeviceModel::lm_head(hidden, n, logits, apply_norm);
  }

  static constexpr int64_t kDeviceBlocks = 77;
  mutable int paged_made = 0, head_calls = 0;
  int argmax_forwards = 0;
};

// A device model that also verifies "on the device" (DeviceVerifier): here on the host, by
// verify_drafts over the rows its forward made, which is the rule the CUDA kernels follow.
class VerifyingModel final : public DelegatingDeviceModel, public DeviceVerifier {
 public:
  using DelegatingDeviceModel::DelegatingDeviceModel;
  bool verifies_on_device() const override { return true; }
  // A step whose requests are all greedy asks for ids only (not a logits step: not counted),
  // as on the GPU; whether such a step occurs depends on when the sampled requests finish.
  void forward_argmax(KVCache& kv, const ForwardBatch& b, ForwardOutput& out, std::vector<int32_t>& ids) override {
    ++argmax_forwards;
    Model::forward_argmax(kv, b, out, ids);
    --forwards;
  }
  int argmax_forwards = 0;
  void forward_verify(KVCache& kv, const ForwardBatch& b, ForwardOutput& out, std::vector<VerifyRequest>& reqs) override {
    ++verify_forwards;
    inner_.forward(kv, b, out);
    const size_t V = static_cast<size_t>(out.vocab_size);
    std::vector<size_t> base(b.entries.size() + 1, 0);
    for (size_t e = 0; e < b.entries.size(); ++e) base[e + 1] = base[e] + b.entries[e].logit_rows.size();
    for (VerifyRequest& r : reqs) {
      const std::vector<int32_t> drafts(r.drafts, r.drafts + r.n_drafts);
      const std::vector<float> q = r.q ? std::vector<float>(r.q, r.q + static_cast<size_t>(r.n_drafts) * V) : std::vector<float>{};
      Rng none;
      const VerifyResult v = verify_drafts(out.logits.data() + (base[static_cast<size_t>(r.entry)] + r.first_row) * V,
                                           static_cast<int>(V), drafts, q, r.params, r.rng ? *r.rng : none);
      r.accepted = v.accepted;
      r.next_token = v.next_token;
      requests += 1;
      with_q += r.q != nullptr;
    }
    out.logits.clear();  // as the device model leaves it
  }
  int verify_forwards = 0, requests = 0, with_q = 0;
};

// A host PagedKVCache with feature rows [blocks][block_size][F] F32 beside it, as the CUDA
// pool keeps them in device memory; copy_block moves them with the K/V.
class FeaturePagedKVCache final : public PagedKVCache {
 public:
  FeaturePagedKVCache(const ModelConfig& c, int block_size, int64_t num_blocks, int max_slots, int max_tokens, int F,
                      DType dtype)
      : PagedKVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, block_size, num_blocks, max_slots,
                     max_tokens, dtype),
        plane(static_cast<size_t>(num_blocks) * block_size * F, std::nanf("")) {
    feature_floats_ = F;
  }
  void copy_block(int32_t src, int32_t dst, int n_tokens) override {
    PagedKVCache::copy_block(src, dst, n_tokens);
    const size_t row = static_cast<size_t>(feature_floats()), blk = row * static_cast<size_t>(block_size());
    std::copy_n(plane.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(src) * blk), static_cast<size_t>(n_tokens) * row,
                plane.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(dst) * blk));
    ++copies;
  }
  float* row(std::span<const int32_t> blocks, int p) {
    const int bs = block_size();
    return plane.data() + (static_cast<size_t>(blocks[static_cast<size_t>(p / bs)]) * bs + p % bs) * feature_floats();
  }
  std::vector<float> plane;  // NaN until written: a row read before its forward would show
  int copies = 0;
};

// A device-like model whose pool keeps the drafter's feature rows when asked: a forward with
// capture_to_cache writes each new token's captured rows at its (slot, position) and returns
// none, as the CUDA model's store_feature_rows does.
class FeaturePoolModel final : public DelegatingDeviceModel {
 public:
  using DelegatingDeviceModel::DelegatingDeviceModel;
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override {
    if (feature_floats == 0) return inner_.make_paged_kv_cache(block_size, num_blocks, max_slots, max_tokens, 0);
    auto p = std::make_unique<FeaturePagedKVCache>(config(), block_size, num_blocks, max_slots, max_tokens,
                                                   feature_floats, inner_.kv_dtype());
    made = p.get();
    return p;
  }
  mutable FeaturePagedKVCache* made = nullptr;
  void forward(KVCache& kv, const ForwardBatch& b, ForwardOutput& out) override {
    if (!b.capture_to_cache) return DelegatingDeviceModel::forward(kv, b, out);
    auto& pool = dynamic_cast<FeaturePagedKVCache&>(kv);
    std::vector<int> start;
    for (const ForwardEntry& e : b.entries) start.push_back(pool.length(e.slot));
    ForwardBatch host = b;
    host.capture_to_cache = false;
    DelegatingDeviceModel::forward(kv, host, out);
    const int F = pool.feature_floats();
    ASSERT_EQ(static_cast<int>(b.capture_layers.size()) * out.hidden_size, F);
    size_t r = 0;
    for (size_t e = 0; e < b.entries.size(); ++e)
      for (size_t i = 0; i < b.entries[e].tokens.size(); ++i, ++r) {
        std::copy_n(out.captured.data() + r * F, F, pool.row(pool.blocks(b.entries[e].slot), start[e] + static_cast<int>(i)));
        ++rows_stored;
      }
    out.captured.clear();
  }
  int rows_stored = 0;
};

// A host drafter that reads its captured rows from FeaturePagedKVCache's feature rows
// (reads_cache_features), as the GPU drafter gathers them from the device pool.
class PoolReadingDrafter final : public Drafter {
 public:
  explicit PoolReadingDrafter(const Drafter& inner) : inner_(inner) {}
  const DrafterInfo& info() const override { return inner_.info(); }
  std::unique_ptr<DraftSequence> start() const override { return inner_.start(); }
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const override {
    inner_.commit_context(seq, tokens, hidden, c);
  }
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                        Rng& rng) const override {
    return inner_.propose(seq, anchor, max_tokens, params, rng);
  }
  std::vector<DraftProposal> propose_batch(const std::vector<DraftBatchItem>& items) const override {
    return inner_.propose_batch(items);
  }
  void commit_context_batch(const std::vector<ContextBatchItem>& items) const override {
    check_batch_items(items, true);
    std::vector<std::vector<float>> rows(items.size());
    std::vector<ContextBatchItem> host = items;
    for (size_t i = 0; i < items.size(); ++i) {
      const ContextBatchItem& it = items[i];
      if (!it.feature_cache) continue;
      auto& pool = const_cast<FeaturePagedKVCache&>(dynamic_cast<const FeaturePagedKVCache&>(*it.feature_cache));
      const int F = pool.feature_floats();
      const int nb = (it.feature_first + it.count + pool.block_size() - 1) / pool.block_size();
      const std::span<const int32_t> table(it.feature_blocks, static_cast<size_t>(nb));
      for (int p = 0; p < it.count; ++p) {
        const float* src = pool.row(table, it.feature_first + p);
        rows[i].insert(rows[i].end(), src, src + F);
      }
      rows_read += it.count;
      host[i].hidden = rows[i].data();
      host[i].feature_cache = nullptr;
    }
    inner_.commit_context_batch(host);
  }
  bool reads_cache_features() const override { return true; }
  bool supports_window() const override { return inner_.supports_window(); }
  void set_window(DraftSequence& seq, int window) const override { inner_.set_window(seq, window); }
  void reserve(DraftSequence& seq, int positions) const override { inner_.reserve(seq, positions); }
  mutable int rows_read = 0;

 private:
  const Drafter& inner_;
};

struct Fixture {
  std::unique_ptr<Model> model;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> plain;  // single-request plain greedy, 24 tokens
};

Fixture& fixture() {
  static Fixture f = [] {
    Fixture r;
    r.model = load_model(kRoot + "/target");
    auto tok = Tokenizer::load(kRoot + "/target");
    std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/models/eval/heldout_code.jsonl");
    for (std::string line; std::getline(in, line) && r.prompts.size() < 10;) {
      auto ids = tok->encode(nlohmann::json::parse(line).at("prompt").get<std::string>(), false);
      ids.resize(std::min<size_t>(ids.size(), 40));
      r.prompts.push_back(ids);
      StopConditions stop;
      stop.max_tokens = 24;
      r.plain.push_back(generate(*r.model, nullptr, ids, SamplingParams{}, stop).ids);
    }
    return r;
  }();
  return f;
}

bool have_target() { return std::filesystem::exists(kRoot + "/target/model.safetensors"); }

std::map<size_t, std::vector<int32_t>> run_all(LLMEngine& engine, const std::vector<SamplingParams>& sampling) {
  Fixture& f = fixture();
  std::map<uint64_t, size_t> case_of;
  std::map<size_t, std::vector<int32_t>> got;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    EngineRequest req;
    req.prompt = f.prompts[i];
    req.stop.max_tokens = 24;
    req.sampling = sampling[i % sampling.size()];
    req.on_event = [&got, i](const RequestEvent& ev) { got[i].insert(got[i].end(), ev.new_ids.begin(), ev.new_ids.end()); };
    case_of[engine.submit(std::move(req))] = i;
  }
  while (engine.step()) {
  }
  return got;
}

}  // namespace

TEST(EngineDeviceModel, KvStorageAndSizingComeFromTheModel) {
  if (!have_target()) GTEST_SKIP() << "shipped target absent";
  DeviceLikeModel m(*fixture().model);
  EngineOptions o;
  o.max_running = 4;
  o.kv_budget_bytes = 1ull << 30;  // a budget: the device model sizes the pool itself
  o.cache_prealloc_ratio = 0.5;
  o.shard_count = 4;
  LLMEngine engine(m, o);
  EXPECT_EQ(m.paged_made, 1);
  EXPECT_EQ(engine.stats().kv_blocks_total, DeviceLikeModel::kDeviceBlocks);
}

// With a drafter, the feature store (captured rows per cached position) is host memory: a
// device-sized pool is capped by the host budget's share for it.
TEST(EngineDeviceModel, DeviceSizedPoolRespectsTheHostFeatureStore) {
  if (!have_target() || !std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "shipped models absent";
  DeviceLikeModel m(*fixture().model);
  auto dspark = load_drafter(kRoot + "/dspark", m);
  const DrafterInfo& info = dspark->info();
  const int64_t feat = static_cast<int64_t>(info.target_layer_ids.size()) * m.config().hidden_size;
  EngineOptions o;
  o.max_running = 2;
  o.drafter = dspark.get();
  o.shard_count = 2;
  o.cache_prealloc_ratio = 0.5;
  o.kv_budget_bytes = static_cast<uint64_t>(40 * 4 * o.kv_block_size * feat);  // 40 blocks' features, half of it: 20
  o.calibration = nullptr;
  LLMEngine capped(m, o);
  EXPECT_EQ(capped.stats().kv_blocks_total, 20);
  o.kv_budget_bytes = 1ull << 34;  // roomy host: the device decides
  LLMEngine roomy(m, o);
  EXPECT_EQ(roomy.stats().kv_blocks_total, DeviceLikeModel::kDeviceBlocks);
}

TEST(EngineDeviceModel, GreedyStepsTakeIdsAndStayLossless) {
  if (!have_target()) GTEST_SKIP() << "shipped target absent";
  Fixture& f = fixture();
  {
    DeviceLikeModel m(*f.model);
    EngineOptions o;
    o.max_running = 6;
    o.max_batch_tokens = 64;
    LLMEngine engine(m, o);
    const auto got = run_all(engine, {SamplingParams{}});
    for (size_t i = 0; i < f.prompts.size(); ++i) EXPECT_EQ(got.at(i), f.plain[i]) << "plain, request " << i;
    EXPECT_GT(m.argmax_forwards, 0);
    EXPECT_EQ(m.forwards, 0);  // every step was greedy: ids only
  }
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "shipped DSpark absent";
  DeviceLikeModel m(*f.model);
  auto dspark = load_drafter(kRoot + "/dspark", m);
  const auto cal = load_calibration(kRoot + "/dspark");
  EngineOptions o;
  o.max_running = 6;
  o.max_batch_tokens = 64;
  o.drafter = dspark.get();
  o.calibration = cal ? &*cal : nullptr;
  o.kv_block_size = 8;
  LLMEngine engine(m, o);
  const auto got = run_all(engine, {SamplingParams{}});
  for (size_t i = 0; i < f.prompts.size(); ++i) EXPECT_EQ(got.at(i), f.plain[i]) << "dspark, request " << i;
  EXPECT_GT(engine.stats().accepted_draft_tokens, 0u);
  EXPECT_EQ(m.forwards, 0);
  const auto& shared = dspark->info().shared_with_target;
  if (std::find(shared.begin(), shared.end(), "lm_head.weight") != shared.end()) {
    EXPECT_GT(m.head_calls, 0);  // the shared head ran through the (device) model
  }
  // With the lookup assist, rounds verifying lookup proposals take ids too.
  DeviceLikeModel m2(*f.model);
  auto dspark2 = load_drafter(kRoot + "/dspark", m2);
  o.drafter = dspark2.get();
  o.lookup_assist = true;
  LLMEngine engine2(m2, o);
  const auto got2 = run_all(engine2, {SamplingParams{}});
  for (size_t i = 0; i < f.prompts.size(); ++i) EXPECT_EQ(got2.at(i), f.plain[i]) << "dspark + lookup, request " << i;
  EXPECT_EQ(m2.forwards, 0);
}

TEST(EngineDeviceModel, SampledRequestsBringLogitRowsBack) {
  if (!have_target()) GTEST_SKIP() << "shipped target absent";
  DeviceLikeModel m(*fixture().model);
  EngineOptions o;
  o.max_running = 4;
  LLMEngine engine(m, o);
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.seed = 3;
  const auto got = run_all(engine, {SamplingParams{}, sampled});
  EXPECT_EQ(got.size(), fixture().prompts.size());
  for (const auto& [i, ids] : got) {
    EXPECT_GT(ids.size(), 0u) << "request " << i;
    EXPECT_LE(ids.size(), 24u) << "request " << i;
  }
  EXPECT_GT(m.forwards, 0);  // steps with a sampled request asked for logit rows
}

TEST(EngineDeviceModel, SampledStepsVerifyThroughTheDeviceVerifier) {
  if (!have_target()) GTEST_SKIP() << "shipped target absent";
  Fixture& f = fixture();
  SamplingParams a, b, c;
  a.temperature = 0.8f, a.seed = 3;
  b.temperature = 1.0f, b.top_k = 40, b.seed = 4;
  c.temperature = 0.7f, c.top_p = 0.9f, c.seed = 5;
  const std::vector<SamplingParams> mix{a, SamplingParams{}, b, c};
  std::unique_ptr<Drafter> dspark;
  if (std::filesystem::exists(kRoot + "/dspark/model.safetensors")) dspark = load_drafter(kRoot + "/dspark", *f.model);
  for (int variant = 0; variant < 3; ++variant) {
    if (variant > 0 && !dspark) break;
    EngineOptions o;
    o.max_running = 4;
    if (variant > 0) o.drafter = dspark.get();
    if (variant == 2) o.synthetic_acceptance_rate = 0.6;
    VerifyingModel m(*f.model);
    LLMEngine on_dev(m, o);
    const auto got = run_all(on_dev, mix);
    LLMEngine on_host(*f.model, o);  // not a device model: logit rows and verify_drafts on the host
    const auto want = run_all(on_host, mix);
    EXPECT_EQ(got, want) << "variant " << variant;
    EXPECT_EQ(m.forwards, 0) << "variant " << variant;  // every step went through forward_verify
    EXPECT_GT(m.verify_forwards, 0) << "variant " << variant;
    if (variant == 1) {
      EXPECT_GT(m.with_q, 0);  // sampled drafts carried the drafter's q rows
    }
    if (variant == 2) continue;  // synthetic acceptance keeps drafts the target would not
    for (size_t i = 1; i < f.prompts.size(); i += mix.size()) EXPECT_EQ(got.at(i), f.plain[i]) << "greedy request " << i;
  }
}

// The single-request path (generate / SpecDecoder) on a DeviceVerifier: every prefill and
// verify step goes through forward_verify, and the tokens are those of the CPU model, plain
// and with the DSpark drafter, greedy and sampled.
TEST(EngineDeviceModel, GenerateVerifiesThroughTheDeviceVerifier) {
  if (!have_target()) GTEST_SKIP() << "shipped target absent";
  Fixture& f = fixture();
  SamplingParams a, b;
  a.temperature = 0.8f, a.top_p = 0.9f, a.seed = 7;
  b.temperature = 1.0f, b.top_k = 40, b.seed = 8;
  std::unique_ptr<Drafter> dspark;
  if (std::filesystem::exists(kRoot + "/dspark/model.safetensors")) dspark = load_drafter(kRoot + "/dspark", *f.model);
  StopConditions stop;
  stop.max_tokens = 24;
  for (const Drafter* d : {static_cast<const Drafter*>(nullptr), static_cast<const Drafter*>(dspark.get())}) {
    SpecOptions spec;
    spec.drafter = d;
    for (size_t i = 0; i < 3; ++i) {
      const SamplingParams p = i == 0 ? SamplingParams{} : i == 1 ? a : b;
      VerifyingModel m(*f.model);
      const auto got = generate(m, nullptr, f.prompts[i], p, stop, {}, spec).ids;
      const auto want = generate(*f.model, nullptr, f.prompts[i], p, stop, {}, spec).ids;
      EXPECT_EQ(got, want) << (d ? "dspark" : "plain") << ", prompt " << i;
      EXPECT_EQ(m.forwards, 0);
      EXPECT_GT(m.verify_forwards, 0);
      if (i == 0) {
        EXPECT_EQ(got, f.plain[i]);
      }
    }
    if (!dspark) break;
  }
}

// Feature rows kept in the model's pool give every request the tokens, drafts and acceptance
// of the engine's host feature store, through prefix sharing (each prompt twice),
// copy-on-write, preemption (a pool too small for every running request) and defrag.
TEST(EngineDeviceModel, FeatureRowsInTheModelPoolEqualTheHostStore) {
  if (!have_target() || !std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  auto dspark = load_drafter(kRoot + "/dspark", *f.model);
  struct Run {
    std::map<size_t, std::vector<int32_t>> got;
    EngineStats stats;
    int rows_stored = 0, rows_read = 0, copies = 0;
  };
  auto run = [&](bool in_pool) {
    FeaturePoolModel m(*f.model);
    PoolReadingDrafter reading(*dspark);
    EngineOptions o;
    o.max_running = 6;
    o.max_batch_tokens = 64;
    o.kv_block_size = 8;
    o.kv_num_blocks = 40;
    o.shard_count = 1;
    o.enable_cache_defrag = true;
    o.drafter = in_pool ? static_cast<const Drafter*>(&reading) : dspark.get();
    LLMEngine engine(m, o);
    Run r;
    for (size_t i = 0; i < 2 * f.prompts.size(); ++i) {
      EngineRequest req;
      req.prompt = f.prompts[i % f.prompts.size()];
      req.stop.max_tokens = 24;
      req.on_event = [&r, i](const RequestEvent& ev) { r.got[i].insert(r.got[i].end(), ev.new_ids.begin(), ev.new_ids.end()); };
      engine.submit(std::move(req));
    }
    while (engine.step()) {
    }
    engine.step();  // idle: defrag
    r.stats = engine.stats();
    r.rows_stored = m.rows_stored;
    r.rows_read = reading.rows_read;
    r.copies = m.made ? m.made->copies : 0;
    return r;
  };
  const Run host = run(false), pool = run(true);
  ASSERT_EQ(pool.got.size(), 2 * f.prompts.size());
  for (size_t i = 0; i < pool.got.size(); ++i) EXPECT_EQ(pool.got.at(i), f.plain[i % f.prompts.size()]) << "request " << i;
  EXPECT_EQ(pool.got, host.got);
  EXPECT_EQ(pool.stats.drafted_tokens, host.stats.drafted_tokens);
  EXPECT_EQ(pool.stats.accepted_draft_tokens, host.stats.accepted_draft_tokens);
  EXPECT_GT(pool.stats.accepted_draft_tokens, 0u);
  EXPECT_GT(pool.rows_stored, 0);
  EXPECT_GT(pool.rows_read, 0);
  EXPECT_EQ(host.rows_stored, 0);  // the host run kept them in the engine's store
  EXPECT_EQ(host.rows_read, 0);
  // The run went through what moves rows: prefix hits, preemption.
  EXPECT_GT(pool.stats.prompt_tokens_cached, 0u);
  EXPECT_GT(pool.stats.preemptions, 0u);
  EXPECT_GT(pool.copies, 0);  // copy-on-write / defrag moves carried feature rows
}
