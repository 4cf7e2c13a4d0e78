// Test helper: Pearson chi-square goodness of fit of observed counts against exact
// probabilities, used by the losslessness tests of speculative decoding.
//
// Data flow: counts[i] (observed) and probs[i] (exact, summing to 1) -> cells whose
// expected count is below 5 are pooled into one cell (the usual validity rule for the
// chi-square approximation) -> statistic and degrees of freedom (cells - 1) -> compared
// with the chi-square quantile at 0.999 for those degrees of freedom.
//
// Why a fixed 0.999 quantile is a sound bound: the tests use fixed seeds, so each test is
// one deterministic draw of the statistic. A correct sampler passes with probability 0.999
// over the choice of seeds (and, the seeds being fixed, either always or never); a wrong
// one (say, resampling from p instead of the residual) shifts the distribution by several
// percent, which at the sample sizes used gives statistics in the hundreds.
// The quantile comes from the Wilson-Hilferty approximation
//   chi2_q(df) ~= df * (1 - 2/(9 df) + z_q * sqrt(2/(9 df)))^3,  z_0.999 = 3.0902323,
// within 1% of the exact quantile for df > 5, slightly above it (df = 6: 22.68 vs 22.46,
// df = 26: 54.16 vs 54.05); for
// df <= 5 it is less accurate, so those use exact table values.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer_test {

inline double chi2_quantile_999(int df) {
  static const double exact[] = {0.0, 10.828, 13.816, 16.266, 18.467, 20.515};
  if (df <= 0) return 0.0;
  if (df <= 5) return exact[df];
  const double z = 3.0902323, a = 2.0 / (9.0 * df);
  const double t = 1.0 - a + z * std::sqrt(a);
  return df * t * t * t;
}

struct ChiSquare {
  double stat = 0.0;
  int df = 0;
  double bound = 0.0;
  bool impossible = false;  // an outcome of probability 0 was observed
  bool pass() const { return !impossible && stat <= bound; }
  std::string str() const {
    return "chi2 = " + std::to_string(stat) + ", df = " + std::to_string(df) + ", bound(0.999) = " +
           std::to_string(bound) + (impossible ? ", an impossible outcome occurred" : "");
  }
};

inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  ChiSquare r;
  double n = 0.0;
  for (int64_t c : counts) n += static_cast<double>(c);
  double pooled_obs = 0.0, pooled_exp = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    if (probs[i] <= 0.0) {
      if (counts[i] > 0) r.impossible = true;
      continue;
    }
    if (e < 5.0) {
      pooled_obs += static_cast<double>(counts[i]);
      pooled_exp += e;
      continue;
    }
    const double d = static_cast<double>(counts[i]) - e;
    r.stat += d * d / e;
    cells++;
  }
  if (pooled_exp > 0.0) {
    const double d = pooled_obs - pooled_exp;
    r.stat += d * d / pooled_exp;
    cells++;
  }
  r.df = cells - 1;
  r.bound = chi2_quantile_999(r.df);
  return r;
}

}  // namespace dsinfer_test
