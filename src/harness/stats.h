// dsinfer harness: the statistics every report uses — percentiles, means, summaries and
// bootstrap confidence intervals. Pure functions over vectors of samples; no I/O.
//
// Data flow: per-request measurements (latencies in seconds, tokens/s) --summarize-->
// Summary {count, mean, min, p50, p90, p99, max}; a statistic over repeated trials
// --bootstrap_ci (seeded, so a report can be reproduced bit for bit)--> Interval.
//
// Percentile definition (documented once, used everywhere): linear interpolation between
// closest ranks, NumPy's default ("type 7" of Hyndman & Fan 1996). For sorted samples
// x[0..n-1] and q in [0, 100]: h = (n - 1) * q / 100, result = x[floor h] +
// (h - floor h) * (x[floor h + 1] - x[floor h]). P0 is the minimum, P100 the maximum.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsinfer::harness {

// q in [0, 100]; empty input -> NaN. Throws Error for q outside [0, 100] or a NaN sample.
double percentile(std::vector<double> samples, double q);
// Same, over samples already sorted ascending (no copy).
double percentile_sorted(const std::vector<double>& sorted, double q);
double mean(const std::vector<double>& samples);  // empty -> NaN

struct Summary {
  size_t count = 0;
  double mean = 0, min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // NaN when count == 0
};
Summary summarize(const std::vector<double>& samples);

// A small deterministic generator (SplitMix64): the same seed gives the same stream on
// every platform and standard library (std::*_distribution is implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();                 // [0, 1)
  size_t index(size_t n);           // [0, n), n > 0
  double exponential(double rate);  // mean 1 / rate
  double normal();                  // standard normal (Box-Muller)

 private:
  uint64_t state_;
};

struct Interval {
  double estimate = 0;  // the statistic on the original sample
  double low = 0, high = 0;
  double confidence = 0.95;
};

// Percentile bootstrap (Efron): resample `samples` with replacement `resamples` times,
// compute `statistic` on each, and take the (1-c)/2 and (1+c)/2 percentiles of those.
// Empty input -> NaN interval.
Interval bootstrap_ci(const std::vector<double>& samples, const std::function<double(const std::vector<double>&)>& statistic,
                      int resamples = 2000, double confidence = 0.95, uint64_t seed = 1);

// "12.3 ms" / "1.23 s" for a duration in seconds (reports); "n/a" for NaN.
std::string format_seconds(double s);
// "%.*f" with "n/a" for NaN.
std::string format_number(double v, int decimals = 2);

}  // namespace dsinfer::harness
