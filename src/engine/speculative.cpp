// dsinfer engine: the speculative round driver (see speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/device_verify.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/prefix_scheduler.h"
#include "spec/verify.h"

namespace dsinfer {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

std::string spec_round_json(const SpecRound& r) {
  nlohmann::json j;
  j["round"] = r.index;
  j["start"] = r.start;
  j["anchor"] = r.anchor;
  j["draft_ids"] = r.draft_ids;
  nlohmann::json conf = nlohmann::json::array();
  for (float c : r.confidences) conf.push_back(std::isfinite(c) ? nlohmann::json(c) : nlohmann::json());
  j["confidences"] = conf;
  j["drafted"] = r.drafted;
  j["verify_len"] = r.verify_len;
  j["accepted"] = r.accepted;
  j["next_token"] = r.next_token;
  j["committed"] = r.committed;
  j["draft_ms"] = r.draft_ms;
  j["verify_ms"] = r.verify_ms;
  j["source"] = r.lookup ? "lookup" : r.draft_ids.empty() && r.drafted == 0 ? "none" : "drafter";
  return j.dump();
}

void SpecStats::add(const SpecRound& r) {
  rounds++;
  committed += r.committed;
  const size_t n = r.draft_ids.size();
  if (proposed.size() < n) {
    proposed.resize(n, 0);
    accepted.resize(n, 0);
  }
  for (size_t k = 0; k < n; ++k) {
    proposed[k]++;
    if (static_cast<int>(k) < r.accepted) accepted[k]++;
  }
  draft_ms += r.draft_ms;
  verify_ms += r.verify_ms;
  if (r.lookup) lookup_rounds++;
}

void check_drafter_kind(const std::string& method, const DrafterInfo& info) {
  bool ok = (method == "dflash" && (info.kind == "dflash" || info.kind == "dflash-deepspec")) ||
            (method == "dspark" && info.kind == "dspark") || (method == "ngram" && info.kind == "ngram");
  if (!ok)
    throw Error("--spec " + method + ": the loaded drafter is of kind '" + info.kind + "'" +
                (info.kind == "dspark" ? " (use --spec dspark)"
                 : info.kind.rfind("dflash", 0) == 0 ? " (use --spec dflash)"
                                                     : ""));
}

int drafts_for_block_size(const DrafterInfo& info, int block_size) {
  if (info.block_size <= 0) throw Error("--block-size: drafter '" + info.kind + "' has no block size");
  if (block_size < 1 || block_size > info.block_size)
    throw Error("--block-size: " + std::to_string(block_size) + " is outside [1, " + std::to_string(info.block_size) +
                "] (the draft checkpoint's block size is " + std::to_string(info.block_size) + ")");
  return std::max(0, info.max_draft_tokens - (info.block_size - block_size));
}

SpecDecoder::SpecDecoder(Model& model, const SamplingParams& params, const SpecOptions& opts, int capacity)
    : model_(model), params_(params), opts_(opts), rng_(params.seed), capacity_(capacity) {
  validate_sampling_params(params);
  if (capacity <= 0) throw Error("speculative decoding: KV capacity must be > 0");
  if (opts_.drafter) {
    const DrafterInfo& info = opts_.drafter->info();
    max_drafts_ = opts_.max_draft_tokens >= 0 ? std::min(opts_.max_draft_tokens, info.max_draft_tokens)
                                              : info.max_draft_tokens;
    if (opts_.max_reuse_depth >= 0) max_drafts_ = std::min(max_drafts_, opts_.max_reuse_depth);
    max_drafts_ = std::max(max_drafts_, 0);
    capture_ = info.target_layer_ids;
    feat_ = static_cast<int>(capture_.size()) * model.config().hidden_size;
    seq_ = opts_.drafter->start();
    if (opts_.lookup_assist) {
      // Sampled output must be reproducible from its seed, and which proposal a round
      // verifies changes how the seed's stream is drawn: a sampled sequence decides on fixed
      // relative costs (a drafter pass as dear as a one-token verify, each verified row a
      // quarter of that, about this CPU's shape), never on measured time.
      if (!params_.greedy()) costs_.set_fixed(1.0, 1.0, 0.25);
      if (info.kind == "ngram") throw Error("--spec-lookup: needs a model drafter (dflash or dspark); --spec ngram is a lookup already");
      lookup_ = std::make_unique<LookupTracker>(opts_.lookup);
    }
  } else if (opts_.lookup_assist) {
    throw Error("--spec-lookup: needs a model drafter (dflash or dspark)");
  }
  kv_ = model.make_kv_cache(1, capacity + max_drafts_ + 1);
}

SpecDecoder::~SpecDecoder() = default;

int32_t SpecDecoder::prefill(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) throw Error("prompt: empty (at least one token is needed)");
  if (kv_->length(0) != 0) throw Error("speculative decoding: prefill called twice");
  ForwardBatch batch;
  batch.capture_layers = capture_;
  batch.entries.resize(1);
  batch.entries[0].slot = 0;
  batch.entries[0].tokens = prompt;
  batch.entries[0].logit_rows = {static_cast<int>(prompt.size()) - 1};
  ForwardOutput out;
  anchor_ = forward_verify(batch, out, {}, {}).next_token;
  if (seq_) {
    opts_.drafter->reserve(*seq_, capacity_);
    opts_.drafter->commit_context(*seq_, prompt.data(), feat_ ? out.captured.data() : nullptr,
                                  static_cast<int>(prompt.size()));
  }
  if (lookup_) lookup_->commit(prompt.data(), static_cast<int>(prompt.size()), lookup_stats_);
  return anchor_;
}

VerifyResult SpecDecoder::forward_verify(const ForwardBatch& batch, ForwardOutput& out, const std::vector<int32_t>& drafts,
                                         const std::vector<float>& q) {
  auto* dv = dynamic_cast<DeviceVerifier*>(&model_);
  if (dv && dv->verifies_on_device()) {
    std::vector<VerifyRequest> reqs(1);
    VerifyRequest& r = reqs[0];
    r.params = params_;
    r.drafts = drafts.data();
    r.n_drafts = static_cast<int>(drafts.size());
    r.q = q.empty() ? nullptr : q.data();
    r.rng = &rng_;
    dv->forward_verify(*kv_, batch, out, reqs);
    VerifyResult v;
    v.accepted = r.accepted;
    v.next_token = r.next_token;
    return v;
  }
  model_.forward(*kv_, batch, out);
  return verify_drafts(out.logits.data(), out.vocab_size, drafts, q, params_, rng_);
}

void SpecDecoder::flush_commit() {
  if (!seq_ || pending_tokens_.empty()) return;
  opts_.drafter->commit_context(*seq_, pending_tokens_.data(), feat_ ? pending_hidden_.data() : nullptr,
                                static_cast<int>(pending_tokens_.size()));
  pending_tokens_.clear();
  pending_hidden_.clear();
}

SpecRound& SpecDecoder::round(int max_new) {
  if (max_new < 1) throw Error("speculative decoding: a round needs a budget of at least one token");
  if (kv_->length(0) == 0) throw Error("speculative decoding: round before prefill");
  SpecRound& r = rec_;
  r = SpecRound{};
  r.index = rounds_++;
  r.start = kv_->length(0);
  r.anchor = anchor_;

  // Draft.
  auto t0 = Clock::now();
  DraftProposal prop;
  const int n_max = std::min(max_drafts_, max_new - 1);
  int match_bucket = LookupStats::kBuckets;  // the drafter yield slot of this round
  if (lookup_ && n_max > 0) {
    const LookupProposal& lp = lookup_->propose(anchor_, n_max);
    if (lp.bucket >= 0) match_bucket = lp.bucket;
    constexpr int kOwnYieldRounds = 3;
    const DrafterYield& y = yield_by_match_[static_cast<size_t>(match_bucket)].rounds >= kOwnYieldRounds
                                ? yield_by_match_[static_cast<size_t>(match_bucket)]
                                : yield_;
    const LookupChoice ch = choose_lookup(lookup_stats_, lp, costs_, y);
    if (ch.use) {
      prop.tokens.assign(lp.tokens.begin(), lp.tokens.begin() + ch.verify_drafts);
      prop.confidence = lookup_confidences(lookup_stats_, lp.bucket, ch.verify_drafts);
      r.lookup = true;
    }
  }
  if (seq_ && !r.lookup) {
    // The cost model times the commit with the pass: the rows piled up over lookup rounds
    // are paid only when the drafter runs again, and never if the lookup keeps winning.
    const auto tp = Clock::now();
    flush_commit();
    if (n_max > 0) {
      prop = opts_.drafter->propose(*seq_, anchor_, n_max, params_, rng_);
      if (params_.greedy()) costs_.observe_draft(ms_since(tp));
    }
  }
  if (static_cast<int>(prop.tokens.size()) > n_max)
    throw Error("drafter '" + opts_.drafter->info().kind + "' proposed " + std::to_string(prop.tokens.size()) +
                " tokens, more than the " + std::to_string(n_max) + " asked for");
  r.drafted = static_cast<int>(prop.tokens.size());
  if ((opts_.validation_threshold > 0.0f || opts_.sps) && !prop.tokens.empty() && !r.lookup) {
    if (prop.confidence_logits.size() != prop.tokens.size())
      throw Error(std::string(opts_.sps ? "--spec-schedule dspark" : "--dflash-validation-threshold") + ": drafter '" +
                  opts_.drafter->info().kind + "' has no confidence head");
    // Without calibration.json every T_k is 1: the raw cumulative product of sigmoids.
    const std::vector<float> survival =
        calibrated_survival(opts_.calibration ? *opts_.calibration : Calibration{}, prop.confidence_logits);
    int keep = static_cast<int>(prop.tokens.size());
    if (opts_.validation_threshold > 0.0f) keep = static_threshold_length(survival, opts_.validation_threshold, keep);
    if (opts_.sps && keep > 0) {
      ScheduleCaps caps;
      caps.per_request.push_back(RequestCaps{keep, -1, -1});
      keep = schedule_greedy({survival}, *opts_.sps, caps).lengths[0];
    }
    keep_first_drafts(prop, static_cast<size_t>(keep));
  }
  const int n = static_cast<int>(prop.tokens.size());
  r.draft_ms = ms_since(t0);

  // Verify: one forward over [anchor, d_1..d_n], logits of every row.
  auto t1 = Clock::now();
  ForwardBatch& batch = batch_;
  batch.capture_layers = capture_;
  batch.entries.resize(1);
  ForwardEntry& e = batch.entries[0];
  e.slot = 0;
  e.tokens.clear();
  e.tokens.push_back(anchor_);
  e.tokens.insert(e.tokens.end(), prop.tokens.begin(), prop.tokens.end());
  e.logit_rows.resize(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) e.logit_rows[static_cast<size_t>(i)] = i;
  ForwardOutput& out = out_;
  VerifyResult v = forward_verify(batch, out, prop.tokens, prop.q);
  // Roll back: keep the anchor and the accepted drafts; the next token is the next anchor.
  kv_->truncate(0, r.start + v.accepted + 1);
  r.verify_ms = ms_since(t1);
  if (lookup_) {
    if (params_.greedy()) costs_.observe_verify(n + 1, r.verify_ms);
    if (!r.lookup && n > 0) {
      yield_.observe(v.accepted + 1, n + 1);
      yield_by_match_[static_cast<size_t>(match_bucket)].observe(v.accepted + 1, n + 1);
    }
  }

  r.verify_len = n + 1;
  r.draft_ids = std::move(prop.tokens);
  r.confidences = std::move(prop.confidence);
  r.accepted = v.accepted;
  r.next_token = v.next_token;
  r.tokens.assign(r.draft_ids.begin(), r.draft_ids.begin() + v.accepted);
  r.tokens.push_back(v.next_token);
  if (seq_) {
    // Appended, not replaced: after lookup rounds the drafter catches up on its next pass.
    const size_t first = pending_tokens_.size();
    pending_tokens_.push_back(anchor_);
    pending_tokens_.insert(pending_tokens_.end(), r.tokens.begin(), r.tokens.end() - 1);
    if (feat_)
      pending_hidden_.insert(pending_hidden_.end(), out.captured.begin(),
                             out.captured.begin() + static_cast<ptrdiff_t>(v.accepted + 1) * feat_);
    if (lookup_)
      lookup_->commit(pending_tokens_.data() + first, static_cast<int>(pending_tokens_.size() - first), lookup_stats_);
  }
  anchor_ = v.next_token;
  return r;
}

}  // namespace dsinfer
