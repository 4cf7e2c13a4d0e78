// dsinfer speculation floor: the DSpark Hardware-Aware Prefix Scheduler, the simpler
// `--spec-schedule` policies and the SPS cost table (see prefix_scheduler.h for the data
// flow). Every policy builds the same global candidate order and admits a prefix of it.
#include "spec/prefix_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"
#include "spec/calibration.h"

namespace dsinfer {

namespace {

constexpr const char* kSpsKind = "dsinfer-sps-table";

// ---- candidates -------------------------------------------------------------------------

struct Candidate {
  double a;  // sanitised a'_{r,j}
  int r;
  int j;  // 1-based draft position
};

// Total order: a descending, then j ascending, then r ascending. j ascending among equal a
// keeps (r, j−1) ahead of (r, j) when c = 1 saturates the product; r ascending makes the
// order deterministic across requests.
bool ranks_before(const Candidate& x, const Candidate& y) {
  if (x.a != y.a) return x.a > y.a;
  if (x.j != y.j) return x.j < y.j;
  return x.r < y.r;
}

int request_count(const Survivals& s, const ScheduleCaps& caps, const char* who) {
  const int R = static_cast<int>(s.size());
  if (!caps.per_request.empty() && static_cast<int>(caps.per_request.size()) != R)
    throw Error(std::string(who) + ": caps.per_request has " + std::to_string(caps.per_request.size()) +
                " entries for " + std::to_string(R) + " requests");
  return R;
}

// min(gamma, proposed, max_depth, remaining − 1) with negative limits ignored, floored at 0.
int effective_cap(int gamma, const RequestCaps* c) {
  int cap = gamma;
  if (c != nullptr) {
    if (c->proposed >= 0) cap = std::min(cap, c->proposed);
    if (c->max_depth >= 0) cap = std::min(cap, c->max_depth);
    if (c->remaining_tokens >= 0) cap = std::min(cap, c->remaining_tokens - 1);
  }
  return std::max(cap, 0);
}

// NaN → 0, clamp to [0, 1], running minimum. Depends only on the prefix a_{r,1..j}.
std::vector<double> sanitise(const std::vector<float>& a) {
  std::vector<double> out(a.size());
  double run = 1.0;
  for (size_t j = 0; j < a.size(); ++j) {
    double x = static_cast<double>(a[j]);
    if (!(x > 0.0)) x = 0.0;  // NaN and negatives
    run = std::min(run, std::min(x, 1.0));
    out[j] = run;
  }
  return out;
}

// Sanitised survivals of every request (kept for τ) and the sorted candidate list.
struct Path {
  int R = 0;
  std::vector<std::vector<double>> a;
  std::vector<Candidate> order;
};

// Candidates (r, j) with j <= cap_r, and a' > 0 unless include_zero (fixed/threshold verify
// zero-survival drafts when asked to; Algorithm 1's E excludes them).
Path build_path(const Survivals& s, const ScheduleCaps& caps, bool include_zero, const char* who) {
  Path p;
  p.R = request_count(s, caps, who);
  p.a.reserve(s.size());
  for (int r = 0; r < p.R; ++r) {
    p.a.push_back(sanitise(s[static_cast<size_t>(r)]));
    const auto& ar = p.a.back();
    const int cap = effective_cap(static_cast<int>(ar.size()),
                                  caps.per_request.empty() ? nullptr : &caps.per_request[static_cast<size_t>(r)]);
    for (int j = 1; j <= cap; ++j) {
      const double x = ar[static_cast<size_t>(j - 1)];
      if (!include_zero && !(x > 0.0)) break;  // non-increasing: the rest are 0 too
      p.order.push_back({x, r, j});
    }
  }
  std::sort(p.order.begin(), p.order.end(), ranks_before);
  return p;
}

// How many candidates of the path fit under the global batch-token cap.
size_t admissible(const Path& p, const ScheduleCaps& caps) {
  if (caps.max_batch_tokens < 0) return p.order.size();
  const int64_t room = static_cast<int64_t>(caps.max_batch_tokens) - p.R;
  if (room <= 0) return 0;
  return std::min(p.order.size(), static_cast<size_t>(room));
}

// The result of admitting the first k candidates of the path. Because the path respects
// prefixes, ℓ_r is simply the largest j of request r among them.
ScheduleResult admit_prefix(const Path& p, size_t k, const SpsTable* sps) {
  ScheduleResult res;
  res.lengths.assign(static_cast<size_t>(p.R), 0);
  res.expected_tokens = p.R;
  for (size_t i = 0; i < k; ++i) {
    const Candidate& c = p.order[i];
    auto& l = res.lengths[static_cast<size_t>(c.r)];
    l = std::max(l, c.j);
    res.expected_tokens += c.a;
  }
  res.draft_tokens = static_cast<int>(k);
  res.batch_tokens = p.R + res.draft_tokens;
  if (sps != nullptr && p.R > 0) res.throughput = res.expected_tokens * sps->sps(res.batch_tokens);
  return res;
}

void need_table(const SpsTable& sps, const char* who) {
  if (sps.empty()) throw Error(std::string(who) + ": the SPS table is empty");
}

// ---- JSON helpers -------------------------------------------------------------------------

[[noreturn]] void field_error(const std::string& file, const std::string& field, const std::string& why) {
  throw Error(file + ": field '" + field + "': " + why);
}

const nlohmann::json& need(const nlohmann::json& j, const std::string& file, const std::string& field) {
  auto it = j.find(field);
  if (it == j.end()) field_error(file, field, "missing");
  return *it;
}

std::string need_string(const nlohmann::json& j, const std::string& file, const std::string& field) {
  const auto& v = need(j, file, field);
  if (!v.is_string()) field_error(file, field, "must be a string");
  return v.get<std::string>();
}

}  // namespace

// ---- SpsTable ---------------------------------------------------------------------------

SpsTable::SpsTable(std::vector<SpsPoint> points, std::string model_hash, std::string machine)
    : points_(std::move(points)), model_hash_(std::move(model_hash)), machine_(std::move(machine)) {
  if (points_.empty()) throw Error("sps table: needs at least one point");
  for (size_t i = 0; i < points_.size(); ++i) {
    const auto& pt = points_[i];
    const std::string at = "sps table: points[" + std::to_string(i) + "]: ";
    if (pt.batch_tokens < 1 || pt.batch_tokens > kMaxSpsBatchTokens)
      throw Error(at + "batch_tokens " + std::to_string(pt.batch_tokens) + " is outside [1, " +
                  std::to_string(kMaxSpsBatchTokens) + "]");
    if (i > 0 && pt.batch_tokens <= points_[i - 1].batch_tokens)
      throw Error(at + "batch_tokens must be strictly increasing");
    if (!std::isfinite(pt.sps) || !(pt.sps > 0.0)) throw Error(at + "sps must be a finite number > 0");
  }
  const int last = points_.back().batch_tokens;
  dense_.assign(static_cast<size_t>(last) + 1, 0.0);
  size_t seg = 0;  // points_[seg] <= B <= points_[seg + 1]
  for (int b = 1; b <= last; ++b) {
    double v;
    if (b <= points_.front().batch_tokens) {
      v = points_.front().sps;
    } else {
      while (points_[seg + 1].batch_tokens < b) ++seg;
      const SpsPoint& lo = points_[seg];
      const SpsPoint& hi = points_[seg + 1];
      if (b == hi.batch_tokens) {
        v = hi.sps;  // measured points are returned exactly
      } else {
        const double f = static_cast<double>(b - lo.batch_tokens) / (hi.batch_tokens - lo.batch_tokens);
        const double t = (1.0 / lo.sps) + f * ((1.0 / hi.sps) - (1.0 / lo.sps));
        v = 1.0 / t;
      }
    }
    dense_[static_cast<size_t>(b)] = v;
  }
  dense_[0] = dense_[1];
}

std::string sps_table_to_json(const SpsTable& t) {
  nlohmann::ordered_json j;
  j["version"] = 1;
  j["kind"] = kSpsKind;
  j["model_hash"] = t.model_hash();
  j["machine"] = t.machine();
  nlohmann::ordered_json pts = nlohmann::ordered_json::array();
  for (const auto& p : t.points()) {
    nlohmann::ordered_json o;
    o["batch_tokens"] = p.batch_tokens;
    o["sps"] = p.sps;
    pts.push_back(o);
  }
  j["points"] = pts;
  return j.dump(2) + "\n";
}

SpsTable parse_sps_table(const std::string& text, const std::string& file) {
  const nlohmann::json j = parse_json(text, file);
  if (!j.is_object()) throw Error(file + ": must hold a JSON object");
  const auto& v = need(j, file, "version");
  if (!v.is_number_integer() || v.get<int64_t>() != 1) field_error(file, "version", "must be 1");
  if (need_string(j, file, "kind") != kSpsKind) field_error(file, "kind", std::string("must be \"") + kSpsKind + "\"");
  std::string model_hash = need_string(j, file, "model_hash");
  std::string machine = need_string(j, file, "machine");
  const auto& pts = need(j, file, "points");
  if (!pts.is_array() || pts.empty()) field_error(file, "points", "must be a non-empty array");
  std::vector<SpsPoint> points;
  for (size_t i = 0; i < pts.size(); ++i) {
    const std::string f = "points[" + std::to_string(i) + "]";
    const auto& o = pts[i];
    if (!o.is_object() || o.size() != 2 || !o.contains("batch_tokens") || !o.contains("sps"))
      field_error(file, f, "must be an object with exactly batch_tokens and sps");
    const auto& b = o["batch_tokens"];
    if (!b.is_number_integer()) field_error(file, f + ".batch_tokens", "must be an integer");
    const int64_t bv = b.get<int64_t>();
    if (bv < 1 || bv > kMaxSpsBatchTokens)
      field_error(file, f + ".batch_tokens",
                  std::to_string(bv) + " is outside [1, " + std::to_string(kMaxSpsBatchTokens) + "]");
    if (!points.empty() && bv <= points.back().batch_tokens)
      field_error(file, f + ".batch_tokens", "must be strictly increasing");
    const auto& s = o["sps"];
    if (!s.is_number() || !std::isfinite(s.get<double>()) || !(s.get<double>() > 0.0))
      field_error(file, f + ".sps", "must be a finite number > 0");
    points.push_back({static_cast<int>(bv), s.get<double>()});
  }
  return SpsTable(std::move(points), std::move(model_hash), std::move(machine));
}

void write_sps_table(const std::string& path, const SpsTable& t) { write_text_file(path, sps_table_to_json(t)); }

SpsTable read_sps_table(const std::string& path) { return parse_sps_table(read_text_file(path), path); }

std::optional<SpsTable> load_sps_cache(const std::string& path, const std::string& model_hash,
                                       const std::string& machine) {
  if (!file_exists(path)) return std::nullopt;
  SpsTable t = read_sps_table(path);
  if (t.model_hash() != model_hash || t.machine() != machine) return std::nullopt;
  return t;
}

// ---- policies ---------------------------------------------------------------------------

ScheduleResult schedule_greedy(const Survivals& survivals, const SpsTable& sps, const ScheduleCaps& caps) {
  const Path p = build_path(survivals, caps, false, "schedule_greedy");
  if (p.R == 0) return {};
  need_table(sps, "schedule_greedy");
  const size_t n = admissible(p, caps);
  int64_t B = p.R;
  double tau = p.R;
  double best = tau * sps.sps(static_cast<int>(B));
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    B += 1;
    tau += p.order[i].a;
    const double theta = tau * sps.sps(static_cast<int>(std::min<int64_t>(B, kMaxSpsBatchTokens)));
    // Strict: a tie also stops. The decision at candidate i uses only candidates 0..i.
    if (!(theta > best)) break;
    best = theta;
    kept = i + 1;
  }
  return admit_prefix(p, kept, &sps);
}

ScheduleResult budget_global(const Survivals& survivals, const SpsTable& sps, const ScheduleCaps& caps) {
  const Path p = build_path(survivals, caps, false, "budget_global");
  if (p.R == 0) return {};
  need_table(sps, "budget_global");
  const size_t n = admissible(p, caps);
  int64_t B = p.R;
  double tau = p.R;
  double best = tau * sps.sps(static_cast<int>(B));
  size_t best_k = 0;
  for (size_t i = 0; i < n; ++i) {  // no break: looks past SPS cliffs
    B += 1;
    tau += p.order[i].a;
    const double theta = tau * sps.sps(static_cast<int>(std::min<int64_t>(B, kMaxSpsBatchTokens)));
    if (theta > best) {
      best = theta;
      best_k = i + 1;
    }
  }
  return admit_prefix(p, best_k, &sps);
}

ScheduleResult schedule_topk(const Survivals& survivals, int k, const ScheduleCaps& caps, const SpsTable* sps) {
  const Path p = build_path(survivals, caps, false, "schedule_topk");
  const size_t n = std::min(admissible(p, caps), static_cast<size_t>(std::max(k, 0)));
  return admit_prefix(p, n, sps != nullptr && !sps->empty() ? sps : nullptr);
}

ScheduleResult threshold_lengths(const Survivals& survivals, float threshold, const ScheduleCaps& caps) {
  const int R = request_count(survivals, caps, "threshold_lengths");
  // Per-request rule first (the same function the single-sequence engine path uses), then
  // keep those drafts as the only candidates of the global order.
  Survivals kept(static_cast<size_t>(R));
  ScheduleCaps inner = caps;
  inner.per_request.assign(static_cast<size_t>(R), RequestCaps{});
  for (int r = 0; r < R; ++r) {
    const auto& s = survivals[static_cast<size_t>(r)];
    const int cap = effective_cap(static_cast<int>(s.size()),
                                  caps.per_request.empty() ? nullptr : &caps.per_request[static_cast<size_t>(r)]);
    inner.per_request[static_cast<size_t>(r)].max_depth = static_threshold_length(s, threshold, cap);
  }
  const Path p = build_path(survivals, inner, /*include_zero=*/true, "threshold_lengths");
  return admit_prefix(p, admissible(p, inner), nullptr);
}

ScheduleResult fixed_lengths(const ScheduleCaps& caps) {
  const size_t R = caps.per_request.size();
  Survivals ones(R);
  for (size_t r = 0; r < R; ++r) {
    const int n = caps.per_request[r].proposed;
    if (n < 0) throw Error("fixed_lengths: request " + std::to_string(r) + ": drafts proposed is unknown (< 0)");
    ones[r].assign(static_cast<size_t>(n), 1.0f);
  }
  const Path p = build_path(ones, caps, true, "fixed_lengths");
  ScheduleResult res = admit_prefix(p, admissible(p, caps), nullptr);
  res.expected_tokens = 0.0;  // no survivals: τ is unknown, not Σ 1
  return res;
}

// ---- AsyncPrefixScheduler ---------------------------------------------------------------

ScheduleResult AsyncPrefixScheduler::step(const Survivals& survivals, const ScheduleCaps& caps) {
  ScheduleResult res;
  int drafting = 0;
  for (const auto& a : survivals) drafting += a.empty() ? 0 : 1;
  if (next_budget_.has_value()) {
    const int k = next_drafting_ > 0 && drafting != next_drafting_
                      ? static_cast<int>(std::lround(static_cast<double>(*next_budget_) * drafting / next_drafting_))
                      : *next_budget_;
    res = schedule_topk(survivals, k, caps, &sps_);
  } else {
    res = schedule_greedy(survivals, sps_, caps);
    res.fallback = true;
  }
  // K for step t+2, from this step's survivals; the engine would compute it in the
  // background while step t+1 runs.
  // A step without any draft says nothing about the budget (K would be 0 and, two steps
  // later, would veto every draft, so nothing would ever be learned again): that step's
  // successor falls back to schedule_greedy instead.
  std::optional<int> k;
  if (drafting > 0) k = budget_global(survivals, sps_, caps).draft_tokens;
  next_budget_ = after_next_budget_;
  after_next_budget_ = k;
  next_drafting_ = after_next_drafting_;
  after_next_drafting_ = drafting;
  ++steps_;
  return res;
}

std::optional<int> AsyncPrefixScheduler::upcoming_budget() const { return next_budget_; }

void AsyncPrefixScheduler::reset() {
  steps_ = 0;
  next_budget_.reset();
  after_next_budget_.reset();
  next_drafting_ = after_next_drafting_ = 0;
}

}  // namespace dsinfer
