// dsinfer model floor: mHC sites (see deepseek_v4_mhc.h). Follows transformers 5.17
// DeepseekV4HyperConnection / DeepseekV4HyperHead step by step; the Sinkhorn loop is one
// softmax + column normalisation, then (iters − 1) × (row, column) normalisations.
#include "model/deepseek_v4_mhc.h"

#include <cmath>
#include <cstring>

namespace dsinfer {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// flat[r] = rms(X_r) over n·D values (weightless), rows of the projection's input.
void rms_rows(const float* X, int64_t T, int64_t W, float eps, float* flat) {
  for (int64_t r = 0; r < T; ++r) {
    const float* x = X + r * W;
    double ss = 0;
    for (int64_t i = 0; i < W; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / W + eps));
    for (int64_t i = 0; i < W; ++i) flat[r * W + i] = x[i] * inv;
  }
}

}  // namespace

void v4_hc_pre(const V4HcSite& site, const V4HcParams& p, const float* X, int64_t T, float* post, float* comb,
               float* u, std::vector<float>& scratch) {
  const int n = p.n;
  const int64_t D = p.D, W = n * D, M = (2 + n) * n;
  if (scratch.size() < static_cast<size_t>(T * (W + M))) scratch.resize(static_cast<size_t>(T * (W + M)));
  float* flat = scratch.data();
  float* z = flat + T * W;
  rms_rows(X, T, W, p.eps, flat);
  v4_matmul(flat, T, *site.fn, z);
  const float* b = site.base;
  const float s0 = site.scale[0], s1 = site.scale[1], s2 = site.scale[2];
  float pre[64];
  for (int64_t r = 0; r < T; ++r) {
    const float* zr = z + r * M;
    for (int j = 0; j < n; ++j) {
      pre[j] = sigmoid(zr[j] * s0 + b[j]) + p.hc_eps;
      post[r * n + j] = 2.0f * sigmoid(zr[n + j] * s1 + b[n + j]);
    }
    float* C = comb + r * n * n;
    for (int a = 0; a < n; ++a) {  // row softmax of the logits, + eps
      float mx = -INFINITY;
      for (int c = 0; c < n; ++c) {
        C[a * n + c] = zr[2 * n + a * n + c] * s2 + b[2 * n + a * n + c];
        mx = std::fmax(mx, C[a * n + c]);
      }
      float sum = 0;
      for (int c = 0; c < n; ++c) sum += (C[a * n + c] = std::exp(C[a * n + c] - mx));
      for (int c = 0; c < n; ++c) C[a * n + c] = C[a * n + c] / sum + p.hc_eps;
    }
    auto col_norm = [&] {
      for (int c = 0; c < n; ++c) {
        float s = 0;
        for (int a = 0; a < n; ++a) s += C[a * n + c];
        for (int a = 0; a < n; ++a) C[a * n + c] /= (s + p.hc_eps);
      }
    };
    auto row_norm = [&] {
      for (int a = 0; a < n; ++a) {
        float s = 0;
        for (int c = 0; c < n; ++c) s += C[a * n + c];
        for (int c = 0; c < n; ++c) C[a * n + c] /= (s + p.hc_eps);
      }
    };
    col_norm();
    for (int it = 0; it < p.iters - 1; ++it) {
      row_norm();
      col_norm();
    }
    float* ur = u + r * D;
    const float* xr = X + r * W;
    for (int64_t k = 0; k < D; ++k) {
      float acc = 0;
      for (int j = 0; j < n; ++j) acc += pre[j] * xr[j * D + k];
      ur[k] = acc;
    }
  }
}

void v4_hc_post(const V4HcParams& p, const float* post, const float* comb, const float* y, int64_t T, float* X) {
  const int n = p.n;
  const int64_t D = p.D;
  std::vector<float> old(static_cast<size_t>(n * D));
  for (int64_t r = 0; r < T; ++r) {
    float* xr = X + r * n * D;
    std::memcpy(old.data(), xr, sizeof(float) * n * D);
    const float* C = comb + r * n * n;
    for (int k = 0; k < n; ++k) {
      const float pk = post[r * n + k];
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int j = 0; j < n; ++j) acc += C[j * n + k] * old[j * D + d];
        xr[k * D + d] = pk * y[r * D + d] + acc;
      }
    }
  }
}

void v4_hc_head(const V4Linear& fn, const float* base, const float* scale, const V4HcParams& p, const float* X,
                int64_t T, float* h, std::vector<float>& scratch) {
  const int n = p.n;
  const int64_t D = p.D, W = n * D;
  if (scratch.size() < static_cast<size_t>(T * (W + n))) scratch.resize(static_cast<size_t>(T * (W + n)));
  float* flat = scratch.data();
  float* z = flat + T * W;
  rms_rows(X, T, W, p.eps, flat);
  v4_matmul(flat, T, fn, z);
  float pre[64];
  for (int64_t r = 0; r < T; ++r) {
    for (int j = 0; j < n; ++j) pre[j] = sigmoid(z[r * n + j] * scale[0] + base[j]) + p.hc_eps;
    for (int64_t k = 0; k < D; ++k) {
      float acc = 0;
      for (int j = 0; j < n; ++j) acc += pre[j] * X[r * W + j * D + k];
      h[r * D + k] = acc;
    }
  }
}

}  // namespace dsinfer
