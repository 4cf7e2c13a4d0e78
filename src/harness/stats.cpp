// dsinfer harness: percentiles, summaries, the seeded RNG and the bootstrap (see stats.h for
// the percentile definition).
#include "harness/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace dsinfer::harness {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

double percentile_sorted(const std::vector<double>& x, double q) {
  if (!(q >= 0.0 && q <= 100.0)) throw Error("percentile: q must be in [0, 100], got " + std::to_string(q));
  if (x.empty()) return kNaN;
  const double h = (static_cast<double>(x.size()) - 1.0) * q / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= x.size()) return x.back();
  return x[lo] + (h - static_cast<double>(lo)) * (x[lo + 1] - x[lo]);
}

double percentile(std::vector<double> samples, double q) {
  for (double v : samples)
    if (std::isnan(v)) throw Error("percentile: NaN sample");
  std::sort(samples.begin(), samples.end());
  return percentile_sorted(samples, q);
}

double mean(const std::vector<double>& samples) {
  if (samples.empty()) return kNaN;
  double s = 0;
  for (double v : samples) s += v;
  return s / static_cast<double>(samples.size());
}

Summary summarize(const std::vector<double>& samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) {
    s.mean = s.min = s.p50 = s.p90 = s.p99 = s.max = kNaN;
    return s;
  }
  std::vector<double> x = samples;
  for (double v : x)
    if (std::isnan(v)) throw Error("summarize: NaN sample");
  std::sort(x.begin(), x.end());
  s.mean = mean(x);
  s.min = x.front();
  s.max = x.back();
  s.p50 = percentile_sorted(x, 50);
  s.p90 = percentile_sorted(x, 90);
  s.p99 = percentile_sorted(x, 99);
  return s;
}

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

size_t Rng::index(size_t n) {
  // Multiply-shift (Lemire) without the rejection step: bias < n / 2^64, negligible here.
  return static_cast<size_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

double Rng::exponential(double rate) { return -std::log1p(-uniform()) / rate; }

double Rng::normal() {
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

Interval bootstrap_ci(const std::vector<double>& samples, const std::function<double(const std::vector<double>&)>& statistic,
                      int resamples, double confidence, uint64_t seed) {
  if (resamples < 1) throw Error("bootstrap: resamples must be >= 1");
  if (!(confidence > 0.0 && confidence < 1.0)) throw Error("bootstrap: confidence must be in (0, 1)");
  Interval iv;
  iv.confidence = confidence;
  if (samples.empty()) {
    iv.estimate = iv.low = iv.high = kNaN;
    return iv;
  }
  iv.estimate = statistic(samples);
  Rng rng(seed);
  std::vector<double> stats;
  stats.reserve(static_cast<size_t>(resamples));
  std::vector<double> resample(samples.size());
  for (int r = 0; r < resamples; ++r) {
    for (double& v : resample) v = samples[rng.index(samples.size())];
    const double s = statistic(resample);
    if (!std::isnan(s)) stats.push_back(s);
  }
  std::sort(stats.begin(), stats.end());
  iv.low = percentile_sorted(stats, 100.0 * (1.0 - confidence) / 2.0);
  iv.high = percentile_sorted(stats, 100.0 * (1.0 + confidence) / 2.0);
  return iv;
}

std::string format_seconds(double s) {
  if (std::isnan(s)) return "n/a";
  char buf[64];
  if (std::fabs(s) < 1.0) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string format_number(double v, int decimals) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace dsinfer::harness
