// dsinfer engine: SPS(B) profiling and its on-disk cache (see sps_profile.h).
#include "engine/sps_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <sys/stat.h>

#include "core/error.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/calibration.h"
#include "spec/drafter.h"

namespace dsinfer {

namespace {

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Minimum over repetitions after one warm-up: other work on the machine only ever adds
// time, so the fastest repetition is the best estimate of the step's own cost.
template <class F>
double min_time_ms(int repeats, F&& f) {
  f();  // warm-up: first-touch of buffers, caches
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, elapsed_ms(t0));
  }
  return best;
}

// Prefills slot 0 of kv with a deterministic dummy context of `context` tokens (ids spread
// over the vocabulary: content does not change the cost of a dense forward), capturing the
// drafter's layers; returns its tokens, out holds the captured rows.
std::vector<int32_t> prefill_dummy_context(Model& target, const std::vector<int>& capture, int context, KVCache& kv,
                                           ForwardOutput& out) {
  const int vocab = target.config().vocab_size;
  ForwardBatch pre;
  pre.capture_layers = capture;
  pre.entries.resize(1);
  for (int i = 0; i < context; ++i) pre.entries[0].tokens.push_back(static_cast<int32_t>((i * 7919L + 13) % vocab));
  pre.entries[0].logit_rows = {context - 1};
  target.forward(kv, pre, out);
  return std::move(pre.entries[0].tokens);
}

}  // namespace

std::vector<double> monotone_nondecreasing(const std::vector<double>& y) {
  // Pool adjacent violators: blocks of (sum, count); merge while a block's mean is below
  // its predecessor's.
  std::vector<double> sum;
  std::vector<int> cnt;
  for (double v : y) {
    sum.push_back(v);
    cnt.push_back(1);
    while (sum.size() > 1 && sum[sum.size() - 1] / cnt.back() < sum[sum.size() - 2] / cnt[cnt.size() - 2]) {
      sum[sum.size() - 2] += sum.back();
      cnt[cnt.size() - 2] += cnt.back();
      sum.pop_back();
      cnt.pop_back();
    }
  }
  std::vector<double> out;
  for (size_t i = 0; i < sum.size(); ++i) out.insert(out.end(), cnt[i], sum[i] / cnt[i]);
  return out;
}

SpsTable profile_sps(Model& target, const Drafter* drafter, const SpsProfileOptions& opts, double* draft_ms_out) {
  if (opts.max_batch_tokens < 1 || opts.context < 1 || opts.repeats < 1)
    throw Error("sps profile: max_batch_tokens, context and repeats must be >= 1");
  std::vector<int> bs = opts.points;
  if (bs.empty())
    for (int b = 1; b <= opts.max_batch_tokens; ++b) bs.push_back(b);
  const int max_b = *std::max_element(bs.begin(), bs.end());
  const int vocab = target.config().vocab_size;
  std::vector<int> capture;
  if (drafter) capture = drafter->info().target_layer_ids;
  auto kv = target.make_kv_cache(1, opts.context + max_b + 1);
  ForwardOutput out;
  const std::vector<int32_t> ctx = prefill_dummy_context(target, capture, opts.context, *kv, out);

  double draft_ms = 0.0;
  if (drafter && drafter->info().max_draft_tokens > 0) {
    auto seq = drafter->start();
    drafter->commit_context(*seq, ctx.data(), capture.empty() ? nullptr : out.captured.data(),
                            opts.context);
    SamplingParams greedy;
    Rng rng(1);
    const int n = drafter->info().max_draft_tokens;
    draft_ms = min_time_ms(opts.repeats, [&] { drafter->propose(*seq, 42 % vocab, n, greedy, rng); });
  }

  if (draft_ms_out) *draft_ms_out = draft_ms;
  if (!opts.include_draft) draft_ms = 0.0;
  std::vector<ForwardBatch> steps(bs.size());
  for (size_t k = 0; k < bs.size(); ++k) {
    steps[k].capture_layers = capture;
    steps[k].entries.resize(1);
    for (int i = 0; i < bs[k]; ++i) {
      steps[k].entries[0].tokens.push_back(static_cast<int32_t>((i * 104729L + 7) % vocab));
      steps[k].entries[0].logit_rows.push_back(i);
    }
  }
  // Repetitions interleave the points (B = 1, 2, ..., then again), so a burst of other work
  // on the machine hits every point alike instead of bending the curve at some B.
  ForwardOutput o;
  std::vector<int32_t> ids;
  // What the engine runs: a model on a device verifies greedy steps with forward_argmax (ids
  // cross to the host, not vocabulary-wide logit rows, whose copy grows with B and had made
  // every verify row look several times dearer than it is on the GPU).
  // Back to the context after each step (untimed). A state that cannot roll back that far
  // (DeepSeek-V4 keeps rows for V4State::kMaxRollback tokens; a profiled step may be longer)
  // is cleared and the context prefilled again.
  ForwardOutput refill;
  auto restore = [&] {
    try {
      kv->truncate(0, opts.context);
    } catch (const Error&) {
      kv->truncate(0, 0);
      prefill_dummy_context(target, capture, opts.context, *kv, refill);
    }
  };
  auto verify_once = [&](size_t k) {
    const auto t0 = Clock::now();
    if (target.on_device()) target.forward_argmax(*kv, steps[k], o, ids);
    else target.forward(*kv, steps[k], o);
    const double ms = elapsed_ms(t0);
    restore();
    return ms;
  };
  std::vector<double> verify_ms(bs.size(), 1e300);
  for (size_t k = 0; k < bs.size(); ++k) verify_once(k);  // warm-up
  for (int r = 0; r < opts.repeats; ++r)
    for (size_t k = 0; k < bs.size(); ++k) verify_ms[k] = std::min(verify_ms[k], verify_once(k));
  // A forward of more tokens never costs less: what noise left non-monotone is pooled.
  verify_ms = monotone_nondecreasing(verify_ms);
  std::vector<SpsPoint> points;
  for (size_t k = 0; k < bs.size(); ++k) points.push_back({bs[k], 1000.0 / (draft_ms + verify_ms[k])});
  return SpsTable(std::move(points));
}

SpsTable sps_with_drafting(const SpsTable& verify_only, double draft_ms) {
  std::vector<SpsPoint> pts;
  for (const SpsPoint& p : verify_only.points()) pts.push_back({p.batch_tokens, 1000.0 / (draft_ms + 1000.0 / p.sps)});
  return SpsTable(std::move(pts));
}

DraftCostTable::DraftCostTable(std::vector<std::pair<int, double>> points) : points_(std::move(points)) {
  for (size_t i = 0; i < points_.size(); ++i) {
    if (points_[i].first < 1 || !(points_[i].second > 0.0) || (i > 0 && points_[i].first <= points_[i - 1].first))
      throw Error("draft cost table: point " + std::to_string(i) + " (k " + std::to_string(points_[i].first) +
                  ", " + std::to_string(points_[i].second) + " ms) is not k >= 1 increasing with a positive time");
  }
}

void DraftCostTable::set_commit_ms_per_row(double ms) {
  if (!(ms >= 0.0) || !std::isfinite(ms))
    throw Error("draft cost table: commit time per row must be a finite number >= 0, got " + std::to_string(ms));
  commit_ms_per_row_ = ms;
}

double DraftCostTable::ms(int k) const {
  if (k <= 0 || points_.empty()) return 0.0;
  const auto& p = points_;
  if (k <= p.front().first) return p.front().second * k / p.front().first;
  size_t i = 1;
  while (i + 1 < p.size() && p[i].first < k) ++i;
  if (p.size() == 1) return p.front().second * k / p.front().first;
  // Segment [i-1, i]: interpolates inside, extrapolates past the last point.
  const double slope = (p[i].second - p[i - 1].second) / (p[i].first - p[i - 1].first);
  return p[i - 1].second + slope * (k - p[i - 1].first);
}

std::vector<int> draft_cost_batches(int max_running) {
  const int top = std::clamp(max_running, 1, 64);
  std::vector<int> ks;
  for (int k = 1; k < top; k *= 2) ks.push_back(k);
  ks.push_back(top);
  return ks;
}

std::string sps_curve_summary(const SpsTable& t) {
  std::string s;
  char buf[48];
  for (const SpsPoint& p : t.points()) {
    std::snprintf(buf, sizeof buf, "%s%d: %.3f", s.empty() ? "" : ", ", p.batch_tokens, 1000.0 / p.sps);
    s += buf;
  }
  return s;
}

std::string draft_cost_summary(const DraftCostTable& t) {
  std::string s;
  char buf[64];
  for (const auto& [k, ms] : t.points()) {
    std::snprintf(buf, sizeof buf, "%sk=%d %.2f ms", s.empty() ? "" : ", ", k, ms);
    s += buf;
  }
  if (t.commit_ms_per_row() > 0) {
    std::snprintf(buf, sizeof buf, "; context commit %.1f us/row", 1000.0 * t.commit_ms_per_row());
    s += buf;
  }
  return s;
}

DraftCostTable profile_draft_cost(Model& target, const Drafter& drafter, const std::vector<int>& batches, int context,
                                  int repeats) {
  if (batches.empty() || context < 1 || repeats < 1)
    throw Error("draft cost profile: batches must be non-empty, context and repeats >= 1");
  for (size_t i = 0; i < batches.size(); ++i)
    if (batches[i] < 1 || (i > 0 && batches[i] <= batches[i - 1]))
      throw Error("draft cost profile: batches must be increasing and >= 1");
  const int n = drafter.info().max_draft_tokens;
  if (n <= 0) return {};
  const int vocab = target.config().vocab_size;
  const std::vector<int> capture = drafter.info().target_layer_ids;
  auto kv = target.make_kv_cache(1, context + 1);
  ForwardOutput out;
  const std::vector<int32_t> ctx = prefill_dummy_context(target, capture, context, *kv, out);
  // Every sequence gets the same context (its cost, not its content, matters here).
  const int max_k = batches.back();
  std::vector<std::unique_ptr<DraftSequence>> seqs;
  std::vector<ContextBatchItem> commits;
  for (int s = 0; s < max_k; ++s) {
    seqs.push_back(drafter.start());
    drafter.reserve(*seqs.back(), context + n + 1);
    commits.push_back({seqs.back().get(), ctx.data(), capture.empty() ? nullptr : out.captured.data(),
                       context});
  }
  drafter.commit_context_batch(commits);
  SamplingParams greedy;
  std::vector<Rng> rngs;
  for (int s = 0; s < max_k; ++s) rngs.emplace_back(static_cast<uint64_t>(s + 1));
  auto pass = [&](int k) {
    std::vector<DraftBatchItem> items;
    for (int s = 0; s < k; ++s) items.push_back({seqs[s].get(), static_cast<int32_t>((42 + s) % vocab), n, &greedy, &rngs[s]});
    drafter.propose_batch(items);
  };
  std::vector<double> ms(batches.size(), 1e300);
  for (int k : batches) pass(k);  // warm-up
  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < batches.size(); ++i) {
      auto t0 = Clock::now();
      pass(batches[i]);
      ms[i] = std::min(ms[i], elapsed_ms(t0));
    }
  ms = monotone_nondecreasing(ms);
  std::vector<std::pair<int, double>> pts;
  for (size_t i = 0; i < batches.size(); ++i) pts.push_back({batches[i], std::max(ms[i], 1e-6)});
  DraftCostTable table(std::move(pts));
  // The commit of a whole context into a fresh sequence: what a request's first drafter pass
  // (or its first after many steps left out) pays before its block.
  double commit = 1e300;
  for (int r = 0; r < repeats; ++r) {
    auto seq = drafter.start();
    drafter.reserve(*seq, context + n + 1);
    auto t0 = Clock::now();
    drafter.commit_context(*seq, ctx.data(), capture.empty() ? nullptr : out.captured.data(), context);
    commit = std::min(commit, elapsed_ms(t0));
  }
  table.set_commit_ms_per_row(commit / context);
  return table;
}

std::string default_sps_cache_path(const std::string& model_hash) {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* d = std::getenv("DSINFER_CACHE_DIR"); d && *d) dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = fs::path(x) / "dsinfer";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = fs::path(h) / ".cache" / "dsinfer";
  else return "";
  // FNV-1a of the whole identity string: a short, stable file name per target + drafter pair.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : model_hash) h = (h ^ c) * 1099511628211ull;
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(h));
  return (dir / ("sps-" + std::string(key) + ".json")).string();
}

std::string sps_model_hash(const std::string& target_dir, const std::string& draft_dir) {
  // drafter_fingerprint hashes config.json and the safetensors names + sizes of a directory;
  // it works for the target directory as well.
  std::string h = "target " + drafter_fingerprint(target_dir);
  if (!draft_dir.empty()) h += " drafter " + drafter_fingerprint(draft_dir);
  return h;
}

std::string sps_build_identity() {
  struct stat st {};
  if (::stat("/proc/self/exe", &st) != 0) return "build unknown";
  return "build " + std::to_string(static_cast<long long>(st.st_size)) + "-" +
         std::to_string(static_cast<long long>(st.st_mtim.tv_sec)) + "." +
         std::to_string(static_cast<long long>(st.st_mtim.tv_nsec));
}

std::string sps_machine_string(int threads, const SpsProfileOptions& opts) {
  const CpuFeatures& f = cpu_features();
  return f.model_name + " | isa " + isa_level_name(isa_level()) + (f.avx512bf16 ? "+bf16" : "") + " | matmul " +
         matmul_precision_name(matmul_precision()) + " | threads " + std::to_string(threads) +
         " | context " + std::to_string(opts.context) + " | B<=" + std::to_string(opts.max_batch_tokens) +
         " | fastest-of-" + std::to_string(opts.repeats) + "+isotonic | " + sps_build_identity();
}

SpsTable load_or_profile_sps(Model& target, const Drafter* drafter, const std::string& model_hash,
                             const std::string& machine, const std::string& path, const SpsProfileOptions& opts,
                             bool* profiled) {
  if (!path.empty()) {
    if (auto cached = load_sps_cache(path, model_hash, machine);
        cached && cached->max_batch_tokens() >= opts.max_batch_tokens) {
      if (profiled) *profiled = false;
      return *cached;
    }
  }
  SpsTable t = profile_sps(target, drafter, opts);
  SpsTable keyed(t.points(), model_hash, machine);
  if (profiled) *profiled = true;
  if (!path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    try {
      write_sps_table(path, keyed);
    } catch (const Error&) {
      // A read-only cache directory only costs a re-profile next time.
    }
  }
  return keyed;
}

}  // namespace dsinfer
