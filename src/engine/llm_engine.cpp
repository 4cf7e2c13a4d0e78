// dsinfer engine: the batched engine's step loop (see llm_engine.h for the data flow).
#include "engine/llm_engine.h"

#include <algorithm>

#include "core/error.h"
#include "engine/sps_profile.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/prefix_scheduler.h"
#include "spec/verify.h"

namespace dsinfer {

struct LLMEngine::Sequence {
  uint64_t id = 0;
  EngineRequest req;
  int slot = -1;
  int prefilled = 0;       // prompt tokens already in the KV cache
  bool decoding = false;   // prompt done; anchor holds the next token to verify
  int32_t anchor = 0;
  std::unique_ptr<DraftSequence> draft;
  std::vector<int32_t> pending_tokens;  // committed but not yet given to the drafter
  std::vector<float> pending_hidden;
  Rng rng;
  std::unique_ptr<OutputStream> out;
  SpecStats spec;
  bool finished = false;
  // Drafting decision (DSpark policy): expected extra commits Σ a_j and verified drafts of
  // the last step that drafted; steps skipped since.
  double last_gain = 1e30;  // unknown: draft
  int last_len = 0, skipped = 0;
  int probe_interval = 8;  // skipped steps before a re-probe; doubles while probes do not pay (<= 64)
  // This step's work and output.
  DraftProposal prop;
  std::vector<int32_t> step_ids;
  std::string step_text;
};

LLMEngine::LLMEngine(Model& model, const EngineOptions& opts) : model_(model), opts_(opts) {
  if (opts_.max_running < 1) throw Error("engine: max_running must be >= 1");
  if (opts_.max_model_len < 2) throw Error("engine: max_model_len must be >= 2");
  if (opts_.max_batch_tokens < 1) throw Error("engine: max_batch_tokens must be >= 1");
  if (opts_.policy == VerifyPolicy::DSpark && !opts_.sps) throw Error("engine: the dspark policy needs an SPS table");
  if (opts_.policy == VerifyPolicy::Threshold && opts_.validation_threshold <= 0.0f)
    throw Error("engine: the threshold policy needs validation_threshold > 0");
  if (opts_.drafter) {
    const DrafterInfo& info = opts_.drafter->info();
    max_drafts_ = opts_.max_draft_tokens >= 0 ? std::min(opts_.max_draft_tokens, info.max_draft_tokens)
                                              : info.max_draft_tokens;
    max_drafts_ = std::max(max_drafts_, 0);
    capture_ = info.target_layer_ids;
    feat_ = static_cast<int>(capture_.size()) * model.config().hidden_size;
    if (opts_.policy != VerifyPolicy::Fixed && !info.confidence_head)
      throw Error("engine: the " + std::string(opts_.policy == VerifyPolicy::DSpark ? "dspark" : "threshold") +
                  " policy needs a drafter with a confidence head");
  } else if (opts_.policy != VerifyPolicy::Fixed) {
    throw Error("engine: verify policies other than fixed need a drafter");
  }
  // Every verify block must fit one step: anchor + all drafts of every running request is
  // not required, but one request's block is.
  if (opts_.max_batch_tokens < max_drafts_ + 1)
    throw Error("engine: max_batch_tokens (" + std::to_string(opts_.max_batch_tokens) +
                ") must hold one verify block (" + std::to_string(max_drafts_ + 1) + " tokens)");
  kv_ = model.make_kv_cache(opts_.max_running, opts_.max_model_len + max_drafts_ + 1);
  for (int s = opts_.max_running - 1; s >= 0; --s) free_slots_.push_back(s);
}

LLMEngine::~LLMEngine() {
  stop();
  std::lock_guard<std::mutex> step_lock(step_mu_);
  take_inbox();
  for (auto& s : waiting_) finish(*s, "cancelled");
  for (auto& s : running_) finish(*s, "cancelled");
}

uint64_t LLMEngine::submit(EngineRequest req) {
  const auto& cfg = model_.config();
  if (req.prompt.empty()) throw Error("prompt: empty (at least one token is needed)");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= cfg.vocab_size)
      throw Error("prompt: token id " + std::to_string(req.prompt[i]) + " at index " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
  validate_sampling_params(req.sampling);
  if (req.stop.max_tokens <= 0) throw Error("max_tokens: must be > 0, got " + std::to_string(req.stop.max_tokens));
  const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.stop.max_tokens;
  if (total > opts_.max_model_len || total > cfg.max_position_embeddings)
    throw Error("max_tokens: prompt (" + std::to_string(req.prompt.size()) + ") + max_tokens (" +
                std::to_string(req.stop.max_tokens) + ") exceeds the model length limit (" +
                std::to_string(std::min<int64_t>(opts_.max_model_len, cfg.max_position_embeddings)) + ")");
  auto s = std::make_unique<Sequence>();
  s->rng = Rng(req.sampling.seed);
  Sequence* raw = s.get();
  s->out = std::make_unique<OutputStream>(opts_.tokenizer, req.stop,
                                          [raw](std::string_view t) { raw->step_text.append(t); });
  s->req = std::move(req);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = s->id = next_id_++;
    inbox_.push_back(std::move(s));
  }
  cv_.notify_all();
  return id;
}

void LLMEngine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void LLMEngine::take_inbox() {
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!inbox_.empty()) {
      waiting_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    cancels.swap(cancels_);
  }
  for (uint64_t id : cancels) {
    for (auto* list : {&waiting_, &running_})
      for (auto& s : *list)
        if (s->id == id && !s->finished) finish(*s, "cancelled");
  }
}

void LLMEngine::admit() {
  // Priority first, then arrival (ids grow with arrival).
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) {
    return a->req.priority != b->req.priority ? a->req.priority > b->req.priority : a->id < b->id;
  });
  size_t i = 0;
  for (; i < waiting_.size() && !free_slots_.empty(); ++i) {
    Sequence& s = *waiting_[i];
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    kv_->clear(s.slot);
    if (opts_.drafter) s.draft = opts_.drafter->start();
    running_.push_back(std::move(waiting_[i]));
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<ptrdiff_t>(i));
}

void LLMEngine::finish(Sequence& s, const std::string& reason, const std::string& error) {
  if (s.finished) return;
  s.finished = true;
  s.out->finish();
  RequestEvent ev;
  ev.id = s.id;
  ev.new_ids = std::move(s.step_ids);
  ev.new_text = std::move(s.step_text);
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = static_cast<int>(s.req.prompt.size());
  ev.completion_tokens = static_cast<int>(s.out->ids().size());
  ev.spec = s.spec;
  if (s.slot >= 0) {
    kv_->clear(s.slot);  // KV freed at once
    free_slots_.push_back(s.slot);
    s.slot = -1;
  }
  s.draft.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason == "cancelled") stats_.requests_cancelled++;
    else if (reason == "error") stats_.requests_failed++;
    else stats_.requests_finished++;
    stats_.generated_tokens += static_cast<uint64_t>(ev.completion_tokens);
  }
  if (s.req.on_event) s.req.on_event(ev);
}

void LLMEngine::emit_tokens(Sequence& s, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    s.step_ids.push_back(id);
    if (s.out->push(id)) break;
  }
  if (s.out->done()) {
    finish(s, s.out->finish_reason());
    return;
  }
  if (s.req.on_event && (!s.step_ids.empty() || !s.step_text.empty())) {
    RequestEvent ev;
    ev.id = s.id;
    ev.new_ids = std::move(s.step_ids);
    ev.new_text = std::move(s.step_text);
    s.req.on_event(ev);
  }
  s.step_ids.clear();
  s.step_text.clear();
}

std::vector<bool> LLMEngine::choose_drafting(const std::vector<Sequence*>& dec) {
  std::vector<bool> yes(dec.size(), true);
  // Only the dspark policy with a verify-only SPS curve and a known draft cost decides: a
  // request's drafter pass costs draft_ms whatever the scheduler then verifies, so under load
  // drafting can cost more than it brings. Greedy on last step's gains (what drafting that
  // request bought when it last drafted): take requests in decreasing gain while the step's
  // expected throughput (R + Σ gain) / (k·t_draft + t_verify(R + Σ len)) grows. Any choice
  // is lossless (it only decides which requests get drafts). A request left out re-probes
  // after probe_interval skipped steps so its estimate stays current; the interval doubles
  // (8 → 64) each time it is left out again right after a probe, and resets when selected.
  if (opts_.policy != VerifyPolicy::DSpark || opts_.draft_ms_per_request <= 0.0 || dec.empty()) return yes;
  const int R = static_cast<int>(dec.size());
  std::vector<int> order(dec.size());
  for (int i = 0; i < R; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return dec[a]->last_gain > dec[b]->last_gain; });
  auto t_verify = [&](int b) { return 1000.0 / opts_.sps->sps(b); };
  double gain = 0, best = R / t_verify(R);
  int len = 0, k = 0;
  for (; k < R; ++k) {
    const Sequence* s = dec[static_cast<size_t>(order[static_cast<size_t>(k)])];
    if (s->last_gain >= 1e29 || s->skipped >= s->probe_interval) continue;  // forced probes
    const double g = gain + s->last_gain;
    const int l = len + s->last_len;
    const double theta = (R + g) / ((k + 1) * opts_.draft_ms_per_request + t_verify(R + l));
    if (!(theta > best)) break;
    best = theta;
    gain = g;
    len = l;
  }
  for (int i = 0; i < R; ++i) {
    Sequence* s = dec[static_cast<size_t>(order[static_cast<size_t>(i)])];
    const bool probe = s->last_gain >= 1e29 || s->skipped >= s->probe_interval;
    const bool chosen = i < k && !probe;
    yes[static_cast<size_t>(order[static_cast<size_t>(i)])] = chosen || probe;
    if (chosen) {
      s->probe_interval = 8;
    } else if (!probe && s->skipped == 0 && s->last_gain < 1e29) {
      s->probe_interval = std::min(64, s->probe_interval * 2);  // left out right after a probe
    }
    s->skipped = (chosen || probe) ? 0 : s->skipped + 1;
  }
  return yes;
}

bool LLMEngine::step() {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  take_inbox();
  auto drop_finished = [&](std::vector<std::unique_ptr<Sequence>>& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](const auto& s) { return s->finished; }), v.end());
  };
  drop_finished(waiting_);
  drop_finished(running_);
  admit();
  if (running_.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = 0;
    stats_.waiting = static_cast<int>(waiting_.size() + inbox_.size());
    return false;
  }
  const int V = model_.config().vocab_size;

  // 3. Drafting for every request past its prefill, then the verify policy.
  std::vector<Sequence*> dec;
  for (auto& s : running_)
    if (s->decoding) dec.push_back(s.get());
  const std::vector<bool> drafts = choose_drafting(dec);
  for (size_t r = 0; r < dec.size(); ++r) {
    Sequence* s = dec[r];
    s->prop = DraftProposal{};
    const int n_max = std::min(max_drafts_, s->out->remaining() - 1);
    if (s->draft && n_max > 0 && drafts[r]) {
      if (!s->pending_tokens.empty()) {
        opts_.drafter->commit_context(*s->draft, s->pending_tokens.data(),
                                      feat_ ? s->pending_hidden.data() : nullptr,
                                      static_cast<int>(s->pending_tokens.size()));
        s->pending_tokens.clear();
        s->pending_hidden.clear();
      }
      s->prop = opts_.drafter->propose(*s->draft, s->anchor, n_max, s->req.sampling, s->rng);
    }
  }
  Survivals survivals(dec.size());
  ScheduleCaps caps;
  caps.max_batch_tokens = opts_.max_batch_tokens;
  for (size_t r = 0; r < dec.size(); ++r) {
    const DraftProposal& p = dec[r]->prop;
    int n = static_cast<int>(p.tokens.size());
    if (opts_.policy != VerifyPolicy::Fixed && n > 0) {
      survivals[r] = calibrated_survival(opts_.calibration ? *opts_.calibration : Calibration{}, p.confidence_logits);
      if (opts_.validation_threshold > 0.0f) n = static_threshold_length(survivals[r], opts_.validation_threshold, n);
    }
    caps.per_request.push_back(RequestCaps{n, -1, -1});
  }
  ScheduleResult sched;
  if (opts_.policy == VerifyPolicy::DSpark) {
    if (opts_.draft_ms_per_request > 0.0 && !dec.empty())
      sched = schedule_greedy(survivals, sps_with_drafting(*opts_.sps, static_cast<int>(dec.size()),
                                                           opts_.draft_ms_per_request), caps);
    else
      sched = schedule_greedy(survivals, *opts_.sps, caps);
  } else {
    sched = fixed_lengths(caps);
  }
  for (size_t r = 0; r < dec.size(); ++r) {
    DraftProposal& p = dec[r]->prop;
    const size_t n0 = p.tokens.size();
    const size_t n = static_cast<size_t>(sched.lengths[r]);
    if (drafts[r] && opts_.policy == VerifyPolicy::DSpark) {
      // What drafting this request bought this step: expected extra commits and verify rows.
      double g = 0;
      for (size_t j = 0; j < n && j < survivals[r].size(); ++j) g += survivals[r][j];
      dec[r]->last_gain = g;
      dec[r]->last_len = static_cast<int>(n);
    }
    keep_first_drafts(p, n);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.drafted_tokens += n0;
    stats_.verified_draft_tokens += n;
  }

  // 4. One batch: verify blocks first (running requests keep their pace), then prefill
  // chunks in admission order within the remaining token budget.
  ForwardBatch batch;
  batch.capture_layers = capture_;
  std::vector<Sequence*> entry_seq;
  int budget = opts_.max_batch_tokens;
  for (Sequence* s : dec) {
    ForwardEntry e;
    e.slot = s->slot;
    e.tokens.push_back(s->anchor);
    e.tokens.insert(e.tokens.end(), s->prop.tokens.begin(), s->prop.tokens.end());
    for (int i = 0; i < static_cast<int>(e.tokens.size()); ++i) e.logit_rows.push_back(i);
    budget -= static_cast<int>(e.tokens.size());
    batch.entries.push_back(std::move(e));
    entry_seq.push_back(s);
  }
  for (auto& sp : running_) {
    Sequence* s = sp.get();
    if (s->decoding || budget <= 0) continue;
    const int left = static_cast<int>(s->req.prompt.size()) - s->prefilled;
    const int chunk = std::min(left, budget);
    ForwardEntry e;
    e.slot = s->slot;
    e.tokens.assign(s->req.prompt.begin() + s->prefilled, s->req.prompt.begin() + s->prefilled + chunk);
    if (chunk == left) e.logit_rows.push_back(chunk - 1);
    budget -= chunk;
    batch.entries.push_back(std::move(e));
    entry_seq.push_back(s);
  }

  // 5. One forward.
  ForwardOutput out;
  try {
    model_.forward(*kv_, batch, out);
  } catch (const Error& err) {
    for (Sequence* s : entry_seq) finish(*s, "error", err.what());
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps++;
    stats_.forwards++;
  }

  // 6. Per request: verify / finish prefill, roll back, emit.
  size_t logit_row = 0, token_row = 0;
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const ForwardEntry& e = batch.entries[i];
    Sequence& s = *entry_seq[i];
    const float* logits = out.logits.data() + logit_row * static_cast<size_t>(V);
    const float* hidden = feat_ ? out.captured.data() + token_row * static_cast<size_t>(feat_) : nullptr;
    const int n_tok = static_cast<int>(e.tokens.size());
    logit_row += e.logit_rows.size();
    token_row += static_cast<size_t>(n_tok);
    if (s.decoding) {
      const int start = kv_->length(s.slot) - n_tok;
      VerifyResult v = verify_drafts(logits, V, s.prop.tokens, s.prop.q, s.req.sampling, s.rng);
      kv_->truncate(s.slot, start + v.accepted + 1);
      SpecRound r;
      r.draft_ids = s.prop.tokens;
      r.accepted = v.accepted;
      std::vector<int32_t> toks(s.prop.tokens.begin(), s.prop.tokens.begin() + v.accepted);
      toks.push_back(v.next_token);
      if (s.draft) {  // appended: a step that skipped drafting did not flush the previous ones
        s.pending_tokens.push_back(s.anchor);
        s.pending_tokens.insert(s.pending_tokens.end(), toks.begin(), toks.end() - 1);
        if (feat_) s.pending_hidden.insert(s.pending_hidden.end(), hidden, hidden + static_cast<size_t>(v.accepted + 1) * feat_);
      }
      s.anchor = v.next_token;
      const size_t before = s.out->ids().size();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.accepted_draft_tokens += static_cast<uint64_t>(v.accepted);
        stats_.verify_entries++;
      }
      emit_tokens(s, toks);
      r.committed = static_cast<int>(s.out->ids().size() - before);
      s.spec.add(r);
    } else {
      if (s.draft) {
        s.pending_tokens.insert(s.pending_tokens.end(), e.tokens.begin(), e.tokens.end());
        if (feat_) s.pending_hidden.insert(s.pending_hidden.end(), hidden, hidden + static_cast<size_t>(n_tok) * feat_);
      }
      s.prefilled += n_tok;
      if (!e.logit_rows.empty()) {  // the prompt is complete: its last row gives the first token
        {
          std::lock_guard<std::mutex> lock(mu_);
          stats_.prompt_tokens += s.req.prompt.size();
        }
        s.anchor = verify_drafts(logits, V, {}, {}, s.req.sampling, s.rng).next_token;
        s.decoding = true;
        emit_tokens(s, {s.anchor});
      }
    }
  }
  drop_finished(running_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int>(running_.size());
    stats_.waiting = static_cast<int>(waiting_.size() + inbox_.size());
  }
  return true;
}

void LLMEngine::run_until_idle() {
  while (step()) {
  }
}

void LLMEngine::start() {
  if (loop_.joinable()) return;
  stop_ = false;
  loop_ = std::thread([this] {
    while (!stop_) {
      if (step()) continue;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
    }
  });
}

void LLMEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

EngineStats LLMEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  return s;
}

}  // namespace dsinfer
