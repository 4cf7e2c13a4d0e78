// dsinfer speculation floor: confidence-head calibration metrics, Sequential Temperature
// Scaling and calibration.json (see calibration.h for the data flow).
#include "spec/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"

namespace dsinfer {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double clamp_pred(double p) {
  if (!(p >= kCalibrationClamp)) return kCalibrationClamp;  // NaN too
  return std::min(p, 1.0 - kCalibrationClamp);
}

// ---- SHA-256 (FIPS 180-4), only for the drafter fingerprint ------------------------------
class Sha256 {
 public:
  Sha256() { h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}; }
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    bits_ += static_cast<uint64_t>(n) * 8;
    while (n > 0) {
      const size_t take = std::min(n, 64 - fill_);
      std::copy(p, p + take, buf_.begin() + static_cast<long>(fill_));
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 64) {
        block(buf_.data());
        fill_ = 0;
      }
    }
  }
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::string hex() {
    const uint64_t bits = bits_;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    std::string out;
    char b[9];
    for (uint32_t w : h_) {
      std::snprintf(b, sizeof b, "%08x", w);
      out += b;
    }
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    static constexpr uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t fill_ = 0;
  uint64_t bits_ = 0;
};

// ---- JSON helpers -------------------------------------------------------------------------
nlohmann::json num_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }
nlohmann::json num_array(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(num_or_null(x));
  return a;
}

[[noreturn]] void field_error(const std::string& file, const std::string& field, const std::string& why) {
  throw Error(file + ": field '" + field + "': " + why);
}

const nlohmann::json& need(const nlohmann::json& j, const std::string& file, const std::string& field) {
  auto it = j.find(field);
  if (it == j.end()) field_error(file, field, "missing");
  return *it;
}

int64_t need_int(const nlohmann::json& j, const std::string& file, const std::string& field, int64_t lo, int64_t hi) {
  const auto& v = need(j, file, field);
  if (!v.is_number_integer()) field_error(file, field, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    field_error(file, field, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

// Array of numbers or nulls (null → NaN), of exactly `len` entries when len >= 0.
std::vector<double> metric_array(const nlohmann::json& j, const std::string& file, const std::string& field, size_t len,
                                 bool required) {
  auto it = j.find(field);
  if (it == j.end()) {
    if (required) field_error(file, field, "missing");
    return {};
  }
  if (!it->is_array()) field_error(file, field, "must be an array of numbers or nulls");
  if (it->size() != len)
    field_error(file, field, "has " + std::to_string(it->size()) + " entries, expected " + std::to_string(len) +
                                 " (one per temperature)");
  std::vector<double> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& e = (*it)[i];
    if (e.is_null()) {
      out.push_back(kNaN);
      continue;
    }
    if (!e.is_number()) field_error(file, field + "[" + std::to_string(i) + "]", "must be a number or null");
    const double x = e.get<double>();
    if (!std::isfinite(x) || x < 0.0 || x > 1.0)
      field_error(file, field + "[" + std::to_string(i) + "]", "must be in [0, 1]");
    out.push_back(x);
  }
  return out;
}

}  // namespace

// ---- metrics ------------------------------------------------------------------------------

double sigmoid_d(double z) {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

double expected_calibration_error(const std::vector<double>& pred, const std::vector<uint8_t>& label) {
  if (pred.size() != label.size()) throw Error("calibration: prediction/label size mismatch");
  if (pred.empty()) return 0.0;
  std::array<double, kEceBins> sp{}, sl{};
  std::array<int64_t, kEceBins> cnt{};
  for (size_t i = 0; i < pred.size(); ++i) {
    const double p = clamp_pred(pred[i]);
    const int b = std::min(static_cast<int>(std::floor(p * kEceBins)), kEceBins - 1);
    sp[b] += p;
    sl[b] += label[i] ? 1.0 : 0.0;
    cnt[b]++;
  }
  double ece = 0.0;
  const double N = static_cast<double>(pred.size());
  for (int b = 0; b < kEceBins; ++b)
    if (cnt[b]) ece += (static_cast<double>(cnt[b]) / N) * std::abs(sp[b] / cnt[b] - sl[b] / cnt[b]);
  return ece;
}

double auroc_exact(const std::vector<double>& pred, const std::vector<uint8_t>& label) {
  if (pred.size() != label.size()) throw Error("calibration: prediction/label size mismatch");
  std::vector<size_t> idx(pred.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return clamp_pred(pred[a]) < clamp_pred(pred[b]); });
  // Walk groups of equal prediction in increasing order: every positive beats all
  // negatives in earlier groups and ties with the negatives of its own group (½ each).
  double wins = 0.0;
  int64_t neg_below = 0, pos = 0, neg = 0;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    int64_t gp = 0, gn = 0;
    const double v = clamp_pred(pred[idx[i]]);
    while (j < idx.size() && clamp_pred(pred[idx[j]]) == v) {
      (label[idx[j]] ? gp : gn)++;
      ++j;
    }
    wins += static_cast<double>(gp) * (static_cast<double>(neg_below) + 0.5 * static_cast<double>(gn));
    neg_below += gn;
    pos += gp;
    neg += gn;
    i = j;
  }
  if (pos == 0 || neg == 0) return kNaN;
  return wins / (static_cast<double>(pos) * static_cast<double>(neg));
}

PositionMetrics compute_metrics(const std::vector<double>& pred, const std::vector<uint8_t>& label) {
  PositionMetrics m;
  m.count = static_cast<int64_t>(pred.size());
  m.ece = expected_calibration_error(pred, label);
  m.auroc = auroc_exact(pred, label);
  if (pred.empty()) {
    m.brier = m.mean_pred = m.mean_label = kNaN;
    return m;
  }
  double b = 0.0, sp = 0.0, sl = 0.0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const double p = clamp_pred(pred[i]), y = label[i] ? 1.0 : 0.0;
    b += (p - y) * (p - y);
    sp += p;
    sl += y;
  }
  const double N = static_cast<double>(pred.size());
  m.brier = b / N;
  m.mean_pred = sp / N;
  m.mean_label = sl / N;
  return m;
}

std::vector<double> cumulative_survival(const std::vector<float>& z, const std::vector<double>& temperatures) {
  std::vector<double> a(z.size());
  double prod = 1.0;
  for (size_t k = 0; k < z.size(); ++k) {
    const double T = k < temperatures.size() ? temperatures[k] : 1.0;
    prod *= sigmoid_d(static_cast<double>(z[k]) / T);
    a[k] = prod;
  }
  return a;
}

std::vector<PositionMetrics> position_metrics(const std::vector<CalibrationRound>& rounds,
                                              const std::vector<double>& temperatures, int gamma) {
  std::vector<std::vector<double>> pred(std::max(gamma, 0));
  std::vector<std::vector<uint8_t>> lab(pred.size());
  for (const auto& r : rounds) {
    const std::vector<double> a = cumulative_survival(r.logits, temperatures);
    for (size_t k = 0; k < a.size() && k < pred.size(); ++k) {
      pred[k].push_back(a[k]);
      lab[k].push_back(r.accepted >= static_cast<int>(k) + 1 ? 1 : 0);
    }
  }
  std::vector<PositionMetrics> out;
  for (size_t k = 0; k < pred.size(); ++k) out.push_back(compute_metrics(pred[k], lab[k]));
  return out;
}

// ---- STS ----------------------------------------------------------------------------------

std::vector<double> sts_grid(const StsOptions& o) {
  if (!(o.t_min > 0.0) || !(o.t_max >= o.t_min) || o.points < 1) throw Error("calibration: invalid STS grid");
  std::vector<double> g(o.points);
  const double lo = std::log(o.t_min), hi = std::log(o.t_max);
  for (int i = 0; i < o.points; ++i) g[i] = o.points == 1 ? o.t_min : std::exp(lo + (hi - lo) * i / (o.points - 1));
  // Make T = 1 exact when the grid passes (numerically) through it.
  for (double& t : g)
    if (std::abs(std::log(t)) < 1e-12) t = 1.0;
  return g;
}

std::vector<double> fit_sts(const std::vector<CalibrationRound>& rounds, int gamma, const StsOptions& opts) {
  const std::vector<double> grid = sts_grid(opts);
  std::vector<double> T(std::max(gamma, 0), 1.0);
  for (int k = 0; k < gamma; ++k) {
    // Fixed calibrated prefix ∏_{i<k} σ(z_i/T_i), the raw z_k and label_k of every round with n > k.
    std::vector<double> prefix, zk, pred;
    std::vector<uint8_t> lab;
    for (const auto& r : rounds) {
      if (static_cast<int>(r.logits.size()) <= k) continue;
      double p = 1.0;
      for (int i = 0; i < k; ++i) p *= sigmoid_d(static_cast<double>(r.logits[i]) / T[i]);
      prefix.push_back(p);
      zk.push_back(r.logits[k]);
      lab.push_back(r.accepted >= k + 1 ? 1 : 0);
    }
    if (prefix.empty()) continue;  // no data: T_k stays 1
    pred.resize(prefix.size());
    double best_ece = std::numeric_limits<double>::infinity(), best_t = 1.0;
    for (double t : grid) {
      for (size_t i = 0; i < prefix.size(); ++i) pred[i] = prefix[i] * sigmoid_d(zk[i] / t);
      const double e = expected_calibration_error(pred, lab);
      const bool better = e < best_ece - 1e-12;
      const bool tie = !better && std::abs(e - best_ece) <= 1e-12 && std::abs(std::log(t)) < std::abs(std::log(best_t));
      if (better) {
        best_ece = e;
        best_t = t;
      } else if (tie) {
        best_t = t;
      }
    }
    T[k] = best_t;
  }
  return T;
}

// ---- calibration.json ---------------------------------------------------------------------

std::string drafter_fingerprint(const std::string& draft_dir) {
  namespace fs = std::filesystem;
  Sha256 h;
  h.update("dsinfer-drafter-fingerprint-v1\nconfig.json\n");
  h.update(read_text_file(draft_dir + "/config.json"));
  std::vector<std::pair<std::string, uintmax_t>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(draft_dir, ec)) {
    const std::string name = e.path().filename().string();
    auto ends = [&](const std::string& suf) {
      return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (e.is_regular_file() && (ends(".safetensors") || ends(".safetensors.index.json")))
      files.emplace_back(name, e.file_size());
  }
  if (ec) throw Error(draft_dir + ": cannot list directory: " + ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& [name, size] : files) h.update("\n" + name + " " + std::to_string(size));
  return "sha256:" + h.hex();
}

std::string calibration_path(const std::string& draft_dir) { return draft_dir + "/calibration.json"; }

std::string calibration_to_json(const Calibration& c) {
  nlohmann::ordered_json j;
  j["version"] = c.version;
  j["method"] = c.method;
  j["temperatures"] = c.temperatures;
  j["block_size"] = c.block_size;
  j["sampling_temperature"] = c.sampling_temperature;
  j["rounds"] = c.rounds;
  j["ece_before"] = num_array(c.ece_before);
  j["ece_after"] = num_array(c.ece_after);
  j["auroc"] = num_array(c.auroc);
  if (!c.auroc_before.empty()) j["auroc_before"] = num_array(c.auroc_before);
  if (c.heldout_rounds > 0) {
    j["heldout_rounds"] = c.heldout_rounds;
    j["heldout_ece_before"] = num_array(c.heldout_ece_before);
    j["heldout_ece_after"] = num_array(c.heldout_ece_after);
    j["heldout_auroc"] = num_array(c.heldout_auroc);
  }
  j["drafter_fingerprint"] = c.drafter_fingerprint;
  j["grid"] = "log-spaced T over [0.25, 4], 101 points; ECE with 20 equal-width bins";
  return j.dump(2) + "\n";
}

Calibration parse_calibration(const std::string& text, const std::string& file) {
  const nlohmann::json j = parse_json(text, file);
  if (!j.is_object()) throw Error(file + ": must hold a JSON object");
  Calibration c;
  c.version = static_cast<int>(need_int(j, file, "version", 1, 1));
  const auto& m = need(j, file, "method");
  if (!m.is_string() || m.get<std::string>() != "sts") field_error(file, "method", "must be \"sts\"");
  c.method = "sts";
  const auto& t = need(j, file, "temperatures");
  if (!t.is_array() || t.empty() || t.size() > 1024)
    field_error(file, "temperatures", "must be a non-empty array of at most 1024 numbers");
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string f = "temperatures[" + std::to_string(i) + "]";
    if (!t[i].is_number()) field_error(file, f, "must be a number");
    const double x = t[i].get<double>();
    if (!std::isfinite(x) || !(x > 0.0)) field_error(file, f, "must be a finite number > 0");
    c.temperatures.push_back(x);
  }
  c.block_size = static_cast<int>(need_int(j, file, "block_size", 1, 1024));
  const auto& st = need(j, file, "sampling_temperature");
  if (!st.is_number() || !std::isfinite(st.get<double>()) || st.get<double>() < 0.0)
    field_error(file, "sampling_temperature", "must be a finite number >= 0");
  c.sampling_temperature = st.get<double>();
  c.rounds = need_int(j, file, "rounds", 0, std::numeric_limits<int64_t>::max());
  const size_t g = c.temperatures.size();
  c.ece_before = metric_array(j, file, "ece_before", g, true);
  c.ece_after = metric_array(j, file, "ece_after", g, true);
  c.auroc = metric_array(j, file, "auroc", g, true);
  c.auroc_before = metric_array(j, file, "auroc_before", g, false);
  if (j.contains("heldout_rounds")) {
    c.heldout_rounds = need_int(j, file, "heldout_rounds", 0, std::numeric_limits<int64_t>::max());
    c.heldout_ece_before = metric_array(j, file, "heldout_ece_before", g, false);
    c.heldout_ece_after = metric_array(j, file, "heldout_ece_after", g, false);
    c.heldout_auroc = metric_array(j, file, "heldout_auroc", g, false);
  }
  const auto& fp = need(j, file, "drafter_fingerprint");
  if (!fp.is_string() || fp.get<std::string>().empty())
    field_error(file, "drafter_fingerprint", "must be a non-empty string");
  c.drafter_fingerprint = fp.get<std::string>();
  return c;
}

void write_calibration(const std::string& path, const Calibration& c) { write_text_file(path, calibration_to_json(c)); }

Calibration read_calibration(const std::string& path) { return parse_calibration(read_text_file(path), path); }

std::optional<Calibration> load_calibration(const std::string& draft_dir) {
  const std::string path = calibration_path(draft_dir);
  if (!file_exists(path)) return std::nullopt;
  Calibration c = read_calibration(path);
  const std::string fp = drafter_fingerprint(draft_dir);
  if (c.drafter_fingerprint != fp)
    field_error(path, "drafter_fingerprint",
                "does not match the checkpoint in " + draft_dir + " (" + fp + "); re-run dsinfer calibrate");
  return c;
}

std::vector<float> calibrated_survival(const Calibration& cal, const std::vector<float>& confidence_logits) {
  const std::vector<double> a = cumulative_survival(confidence_logits, cal.temperatures);
  return std::vector<float>(a.begin(), a.end());
}

int static_threshold_length(const std::vector<float>& survival, float threshold, int cap) {
  int n = static_cast<int>(survival.size());
  if (cap >= 0) n = std::min(n, cap);
  if (!(threshold > 0.0f)) return n;
  for (int k = 0; k < n; ++k)
    if (!(survival[k] >= threshold)) return k;
  return n;
}

}  // namespace dsinfer
