// CUDA backend: the device kernels against CPU references (GEMM, RMSNorm, attention over
// the device KV cache, argmax) and the GEMM's batch invariance. Skipped (GTEST_SKIP) in
// builds without DSINFER_CUDA and on machines without a GPU, which is how CI runs them.
#include <gtest/gtest.h>

#ifdef DSINFER_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_cache.h"
#include "backend/cuda/cuda_quant_gemv.h"
#include "backend/cuda/cuda_sampling.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/matmul_quant.h"
#include "sampling/sampler.h"
#include "spec/verify.h"

using namespace dsinfer;
using namespace dsinfer::cuda;

namespace {

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { DSINFER_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    DSINFER_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    DSINFER_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { DSINFER_CUDA_CHECK(cudaMemset(p, 0x7f, n * sizeof(T))); }  // large finite floats
};

// Random BF16 values (as raw bits) and their F32 values.
std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale, std::vector<float>* as_f32) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> v(n);
  as_f32->resize(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = f32_to_bf16(nd(rng));
    (*as_f32)[i] = bf16_to_f32(v[i]);
  }
  return v;
}

const bf16* as_bf16(const uint16_t* p) { return reinterpret_cast<const bf16*>(p); }

// Random inputs of the row-kernel tests, on the device: M F32 rows x (N(0, 1)), an RMSNorm
// weight (1 + 0.2 N(0, 1)), M SwiGLU rows [g | u] of width 2K, and W [N, K] in BF16 (0.05 N(0, 1)).
struct GemmInputs {
  std::vector<float> x, nw, gu, wf;
  std::unique_ptr<Dev<float>> dx, dnw, dgu;
  std::unique_ptr<Dev<uint16_t>> W;
  GemmInputs(int M, int K, int N, std::mt19937& rng) : x(size_t(M) * K), nw(K), gu(size_t(M) * 2 * K) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    for (auto& v : nw) v = 1.0f + 0.2f * nd(rng);
    for (auto& v : gu) v = nd(rng);
    dx = std::make_unique<Dev<float>>(x);
    dnw = std::make_unique<Dev<float>>(nw);
    dgu = std::make_unique<Dev<float>>(gu);
    W = std::make_unique<Dev<uint16_t>>(random_bf16(size_t(N) * K, rng, 0.05f, &wf));
  }
};

}  // namespace

// Both GEMM paths against a double reference, for a K that takes the 16-byte path and one
// that takes the scalar path.
TEST(CudaKernels, GemmMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (int K : {320, 37}) {
    const int M = 9, N = 77;
    std::vector<float> xf, wf;
    Dev<uint16_t> X(random_bf16(size_t(M) * K, rng, 1.0f, &xf));
    Dev<uint16_t> W(random_bf16(size_t(N) * K, rng, 0.1f, &wf));
    for (bool invariant : {true, false}) {
      SCOPED_TRACE("K " + std::to_string(K) + (invariant ? " invariant" : " cublas"));
      Gemm g(invariant);
      Dev<float> Y(size_t(M) * N);
      Y.poison();
      g.run(GemmInput::bf16_rows(as_bf16(X.p), K), as_bf16(W.p), N, K, Y.p, N, M, false, nullptr, nullptr);
      const std::vector<float> y = Y.get();
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double ref = 0, mag = 0;
          for (int k = 0; k < K; ++k) {
            ref += double(xf[size_t(m) * K + k]) * wf[size_t(n) * K + k];
            mag += std::abs(double(xf[size_t(m) * K + k]) * wf[size_t(n) * K + k]);
          }
          ASSERT_NEAR(y[size_t(m) * N + n], ref, 1e-4 * mag + 1e-6) << "m " << m << " n " << n;
        }
      // accumulate: Y += X·Wᵀ doubles it
      g.run(GemmInput::bf16_rows(as_bf16(X.p), K), as_bf16(W.p), N, K, Y.p, N, M, true, nullptr, nullptr);
      const std::vector<float> y2 = Y.get();
      for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y2[i], 2 * y[i], 1e-5 * std::abs(y[i]) + 1e-6);
    }
  }
}

// The invariant GEMM: a row's bits do not depend on how many rows share the call or where
// the row sits in it (row groups of 4 straddled on purpose).
TEST(CudaKernels, InvariantGemmRowDoesNotDependOnBatch) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const int K = 512, N = 300, M = 13;
  std::vector<float> xf, wf;
  Dev<uint16_t> X(random_bf16(size_t(M) * K, rng, 1.0f, &xf));
  Dev<uint16_t> W(random_bf16(size_t(N) * K, rng, 0.05f, &wf));
  Dev<float> Yall(size_t(M) * N), Yone(N);
  gemm_rows(as_bf16(X.p), K, as_bf16(W.p), N, K, Yall.p, N, M, false, nullptr);
  const std::vector<float> all = Yall.get();
  for (int m = 0; m < M; ++m) {
    gemm_rows(as_bf16(X.p + size_t(m) * K), K, as_bf16(W.p), N, K, Yone.p, N, 1, false, nullptr);
    const std::vector<float> one = Yone.get();
    ASSERT_EQ(0, std::memcmp(one.data(), all.data() + size_t(m) * N, N * sizeof(float))) << "row " << m;
  }
  // The argmax keys folded into the epilogue (greedy LM head) give each row's argmax.
  Dev<unsigned long long> keys(M);
  DSINFER_CUDA_CHECK(cudaMemset(keys.p, 0, M * sizeof(unsigned long long)));
  gemm_rows(GemmInput::bf16_rows(as_bf16(X.p), K), as_bf16(W.p), N, K, Yall.p, N, M, false, nullptr, keys.p);
  const std::vector<unsigned long long> k = keys.get();
  for (int m = 0; m < M; ++m) {
    int best = 0;
    for (int n = 1; n < N; ++n)
      if (all[size_t(m) * N + n] > all[size_t(m) * N + best]) best = n;
    EXPECT_EQ(argmax_from_key(k[m]), best) << "row " << m;
  }
}

// The fused inputs: RMSNorm of F32 rows (gathered through a row index) and SwiGLU of
// [gate | up] rows, against a host reference that rounds A to BF16 the same way; both GEMM
// paths; and, for the invariant kernel, a row alone gives the same bits as in the batch.
TEST(CudaKernels, FusedGemmInputsMatchReferenceAndAreBatchInvariant) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (int K : {256, 36}) {
    const int M = 6, N = 50;
    std::vector<float> x(size_t(M) * 2 * K), nw(K), wf;
    for (auto& v : x) v = nd(rng);
    for (auto& v : nw) v = 1.0f + 0.2f * nd(rng);
    Dev<float> dx(x), dnw(nw);
    Dev<uint16_t> W(random_bf16(size_t(N) * K, rng, 0.1f, &wf));
    const std::vector<int32_t> idx = {5, 0, 3, 3, 1, 2};
    Dev<int32_t> didx(idx);
    Dev<uint16_t> scratch(size_t(M) * K);
    for (int mode = 0; mode < 2; ++mode) {
      // Reference A rows.
      std::vector<float> a(size_t(M) * K);
      for (int m = 0; m < M; ++m) {
        if (mode == 0) {
          const float* xr = x.data() + size_t(idx[m]) * K;  // RMSNorm input: rows of width K (ldx K)
          double ss = 0;
          for (int k = 0; k < K; ++k) ss += double(xr[k]) * xr[k];
          const float inv = float(1.0 / std::sqrt(ss / K + 1e-6));
          for (int k = 0; k < K; ++k) a[size_t(m) * K + k] = bf16_to_f32(f32_to_bf16(nw[k] * (xr[k] * inv)));
        } else {
          const float* g = x.data() + size_t(m) * 2 * K;
          for (int k = 0; k < K; ++k)
            a[size_t(m) * K + k] = bf16_to_f32(f32_to_bf16(g[k] / (1.0f + std::exp(-g[k])) * g[K + k]));
        }
      }
      const GemmInput in = mode == 0 ? GemmInput::rmsnorm_rows(dx.p, K, dnw.p, 1e-6f, didx.p)
                                     : GemmInput::silu_mul_rows(dx.p, 2 * K);
      for (bool invariant : {true, false}) {
        SCOPED_TRACE("K " + std::to_string(K) + (mode ? " swiglu" : " rmsnorm") + (invariant ? " invariant" : " cublas"));
        Gemm g(invariant);
        Dev<float> Y(size_t(M) * N);
        Y.poison();
        g.run(in, as_bf16(W.p), N, K, Y.p, N, M, false, reinterpret_cast<bf16*>(scratch.p), nullptr);
        const std::vector<float> y = Y.get();
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; ++k) {
              ref += double(a[size_t(m) * K + k]) * wf[size_t(n) * K + k];
              mag += std::abs(double(a[size_t(m) * K + k]) * wf[size_t(n) * K + k]);
            }
            // A's BF16 rounding may differ by one step where inv_rms differs in the last bit.
            ASSERT_NEAR(y[size_t(m) * N + n], ref, 8e-3 * mag + 1e-5) << "m " << m << " n " << n;
          }
        if (!invariant) continue;
        for (int m = 0; m < M; ++m) {  // row m alone
          const GemmInput one = mode == 0 ? GemmInput::rmsnorm_rows(dx.p, K, dnw.p, 1e-6f, didx.p + m)
                                          : GemmInput::silu_mul_rows(dx.p + size_t(m) * 2 * K, 2 * K);
          Dev<float> Y1(N);
          g.run(one, as_bf16(W.p), N, K, Y1.p, N, 1, false, nullptr, nullptr);
          const std::vector<float> y1 = Y1.get();
          ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + size_t(m) * N, N * sizeof(float))) << "row " << m;
        }
      }
    }
  }
}

// The row kernel's launch shape (warps per block, resident blocks per SM, the one-row
// instance or the 4-row one at one row) changes no bit: plain, RMSNorm-fused and
// SwiGLU-epilogue GEMMs, accumulate and argmax keys, at one row and at several, each shape
// against the default one; and a row alone (the one-row instance) has the bits it has as
// row 0 of five (4-row blocks). Three shapes: the 4B model's QKV, one as long as its o
// projection, and one as long as the 1.7B model's down projection (N >= K: Y's first K
// columns are the second GEMM's input).
TEST(CudaKernels, InvariantGemmBitsDoNotDependOnBlockShape) {
  SKIP_WITHOUT_GPU();
  // K = 6144 (Qwen3-1.7B's down projection): 4 staged rows are exactly 48 KB of dynamic
  // shared memory, past the default limit with the kernel's static arrays (it failed to launch).
  for (auto [K0, N0] : {std::pair{2560, 6144}, std::pair{4096, 4104}, std::pair{6144, 6144}}) {
    const int K = K0, N = N0;
    SCOPED_TRACE("K " + std::to_string(K) + ", N " + std::to_string(N));
    std::mt19937 rng(31);
    const int M = 13;
    const GemmInputs g(M, K, N, rng);
    const Dev<float>& dx = *g.dx;
    const Dev<float>& dnw = *g.dnw;
    const Dev<float>& dgu = *g.dgu;
    const Dev<uint16_t>& W = *g.W;
    const GemvShape saved = gemv_shape();
    struct Out {
      std::vector<float> y, acc, swiglu_in;
      std::vector<uint16_t> act;
      std::vector<unsigned long long> keys;
    };
    auto run = [&](GemvShape shape, int m) {
      set_gemv_shape(shape);
      Out o;
      const GemmInput in = GemmInput::rmsnorm_rows(dx.p, K, dnw.p, 1e-6f);
      Dev<float> Y(size_t(m) * N);
      Dev<unsigned long long> keys(m);
      DSINFER_CUDA_CHECK(cudaMemset(keys.p, 0, m * sizeof(unsigned long long)));
      gemm_rows(in, as_bf16(W.p), N, K, Y.p, N, m, false, nullptr, keys.p);
      o.y = Y.get();
      o.keys = keys.get();
      // Y's first K columns as a BF16 input, accumulated onto Y.
      Dev<uint16_t> xb(size_t(m) * K);
      std::vector<uint16_t> hb(size_t(m) * K);
      for (int r = 0; r < m; ++r)
        for (int k = 0; k < K; ++k) hb[size_t(r) * K + k] = f32_to_bf16(o.y[size_t(r) * N + k]);
      DSINFER_CUDA_CHECK(cudaMemcpy(xb.p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
      gemm_rows(GemmInput::bf16_rows(as_bf16(xb.p), K), as_bf16(W.p), N, K, Y.p, N, m, true, nullptr);
      o.acc = Y.get();
      Dev<uint16_t> act(size_t(m) * N / 2);
      gemm_rows_silu(in, as_bf16(W.p), N, K, reinterpret_cast<bf16*>(act.p), N / 2, m, nullptr);
      o.act = act.get();
      // SwiGLU rows [g | u] as the input (the down projection's).
      gemm_rows(GemmInput::silu_mul_rows(dgu.p, 2 * K), as_bf16(W.p), N, K, Y.p, N, m, false, nullptr);
      o.swiglu_in = Y.get();
      return o;
    };
    // One row runs the one-row instance, five the 4-row one: row 0 has the same bits in both.
    {
      const Out one = run(GemvShape{}, 1), five = run(GemvShape{}, 5);
      EXPECT_EQ(0, std::memcmp(one.y.data(), five.y.data(), one.y.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(one.acc.data(), five.acc.data(), one.acc.size() * sizeof(float)));
      EXPECT_EQ(one.keys[0], five.keys[0]);
      EXPECT_TRUE(std::equal(one.act.begin(), one.act.end(), five.act.begin()));
    }
    for (int m : {1, 5, M}) {
      const Out ref = run(GemvShape{}, m);
      for (GemvShape shape : {GemvShape{8, 0, false}, GemvShape{8, 1, false}, GemvShape{4, 1, false}, GemvShape{4, 3, false},
                              GemvShape{8, 2, false}, GemvShape{4, 0, true}, GemvShape{8, 0, true}, GemvShape{4, 1, true},
                              GemvShape{4, 0, false, false}, GemvShape{8, 0, true, false}, GemvShape{4, 0, false, true, false},
                              GemvShape{4, 0, false, false, false},
                              // one row per block for up to 16 rows whatever the matrix size, and never
                              GemvShape{4, 0, false, true, true, uint64_t{1} << 40}, GemvShape{8, 0, true, true, false, 0}}) {
        SCOPED_TRACE("rows " + std::to_string(m) + ", warps " + std::to_string(shape.warps) + ", blocks per SM " +
                     std::to_string(shape.blocks_per_sm) + (shape.interleave ? ", interleaved" : "") +
                     (shape.one_row_kernel ? "" : ", no one-row instance") +
                     (shape.evict_first_weights ? "" : ", weights without evict-first") +
                     (shape.one_row_max_bytes > (uint64_t{1} << 32) ? ", one row per block" : ""));
        const Out o = run(shape, m);
        EXPECT_EQ(0, std::memcmp(o.y.data(), ref.y.data(), o.y.size() * sizeof(float)));
        EXPECT_EQ(o.keys, ref.keys);
        EXPECT_EQ(0, std::memcmp(o.acc.data(), ref.acc.data(), o.acc.size() * sizeof(float)));
        EXPECT_EQ(o.act, ref.act);
        EXPECT_EQ(0, std::memcmp(o.swiglu_in.data(), ref.swiglu_in.data(), o.swiglu_in.size() * sizeof(float)));
      }
    }
    set_gemv_shape(saved);
  }
  EXPECT_THROW(set_gemv_shape(GemvShape{6, 0}), Error);
}

// A wide GEMM (many more feature groups than resident blocks, so each block walks several
// groups with the next group's weights prefetched): against a double reference, a row alone
// == the row in the batch, and the argmax keys (reduced per block, then atomicMax) give each
// row's argmax. Then the SwiGLU epilogue (run_silu, (gate, up) rows interleaved): the
// invariant kernel gives the bits of SwiGLU applied to its own plain output, the cuBLAS
// path the reference within BF16 tolerance, and a row alone == the row in the batch.
TEST(CudaKernels, WideGemmWalksGroupsAndSwiGluEpilogue) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  const int K = 256, N = 40002, M = 5;
  std::vector<float> xf, wf;
  Dev<uint16_t> X(random_bf16(size_t(M) * K, rng, 1.0f, &xf));
  Dev<uint16_t> W(random_bf16(size_t(N) * K, rng, 0.1f, &wf));
  Dev<float> Y(size_t(M) * N), Y1(N);
  Y.poison();
  Dev<unsigned long long> keys(M);
  DSINFER_CUDA_CHECK(cudaMemset(keys.p, 0, M * sizeof(unsigned long long)));
  gemm_rows(GemmInput::bf16_rows(as_bf16(X.p), K), as_bf16(W.p), N, K, Y.p, N, M, false, nullptr, keys.p);
  const std::vector<float> y = Y.get();
  const std::vector<unsigned long long> k = keys.get();
  for (int m = 0; m < M; ++m) {
    int best = 0;
    for (int n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int i = 0; i < K; ++i) {
        ref += double(xf[size_t(m) * K + i]) * wf[size_t(n) * K + i];
        mag += std::abs(double(xf[size_t(m) * K + i]) * wf[size_t(n) * K + i]);
      }
      ASSERT_NEAR(y[size_t(m) * N + n], ref, 1e-4 * mag + 1e-6) << "m " << m << " n " << n;
      if (y[size_t(m) * N + n] > y[size_t(m) * N + best]) best = n;
    }
    EXPECT_EQ(argmax_from_key(k[m]), best) << "row " << m;
    gemm_rows(as_bf16(X.p + size_t(m) * K), K, as_bf16(W.p), N, K, Y1.p, N, 1, false, nullptr);
    const std::vector<float> one = Y1.get();
    ASSERT_EQ(0, std::memcmp(one.data(), y.data() + size_t(m) * N, N * sizeof(float))) << "row " << m;
  }

  // SwiGLU epilogue: N = 2I rows taken as (gate_i, up_i) pairs.
  const int I = N / 2;
  Dev<uint16_t> act(size_t(M) * I), act1(I), pairs(size_t(M) * I);
  silu_mul_pairs(Y.p, M, I, reinterpret_cast<bf16*>(pairs.p), I, nullptr);  // SwiGLU of the plain output
  const std::vector<uint16_t> want = pairs.get();
  for (bool invariant : {true, false}) {
    SCOPED_TRACE(invariant ? "invariant" : "cublas");
    Gemm g(invariant);
    Dev<float> gu(size_t(M) * N);
    Dev<uint16_t> scratch(size_t(M) * K);
    act.poison();
    g.run_silu(GemmInput::bf16_rows(as_bf16(X.p), K), as_bf16(W.p), N, K, reinterpret_cast<bf16*>(act.p), I, M, gu.p,
               reinterpret_cast<bf16*>(scratch.p), nullptr);
    const std::vector<uint16_t> a = act.get();
    if (invariant) {
      ASSERT_EQ(0, std::memcmp(a.data(), want.data(), a.size() * 2));
      for (int m = 0; m < M; ++m) {
        g.run_silu(GemmInput::bf16_rows(as_bf16(X.p + size_t(m) * K), K), as_bf16(W.p), N, K,
                   reinterpret_cast<bf16*>(act1.p), I, 1, gu.p, nullptr, nullptr);
        const std::vector<uint16_t> a1 = act1.get();
        ASSERT_EQ(0, std::memcmp(a1.data(), a.data() + size_t(m) * I, size_t(I) * 2)) << "row " << m;
      }
    } else {
      for (size_t i = 0; i < a.size(); ++i) {
        const float gv = y[(i / I) * N + 2 * (i % I)], uv = y[(i / I) * N + 2 * (i % I) + 1];
        const double ref = gv / (1.0 + std::exp(-double(gv))) * uv;
        ASSERT_NEAR(bf16_to_f32(a[i]), ref, std::abs(ref) / 64 + 1e-3) << "i " << i;
      }
    }
  }
}

TEST(CudaKernels, RmsNormMatchesCpuFormula) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int rows = 5, n = 320;
  std::vector<float> x(rows * n), w(n);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
  Dev<float> dx(x), dw(w);
  Dev<uint16_t> dy(size_t(rows) * n);
  std::vector<int32_t> idx = {4, 0, 2};
  Dev<int32_t> didx(idx);
  rmsnorm_rows(dx.p, n, didx.p, 3, n, dw.p, 1e-6f, reinterpret_cast<bf16*>(dy.p), n, nullptr);
  const std::vector<uint16_t> y = dy.get();
  for (int r = 0; r < 3; ++r) {
    const float* xr = x.data() + idx[r] * n;
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; ++i) {
      const double ref = w[i] * xr[i] * inv;
      ASSERT_NEAR(bf16_to_f32(y[size_t(r) * n + i]), ref, std::abs(ref) * (1.0 / 128) + 1e-6) << "row " << r << " i " << i;
    }
  }
}

// Attention over a device cache: rows of one slot at positions 0..n-1 (causal) and a row of
// another slot, against a double reference; a row alone gives the same bits as in the batch.
TEST(CudaKernels, AttentionMatchesReferenceAndIsBatchInvariant) {
  SKIP_WITHOUT_GPU();
  const int NH = 4, NKVH = 2, slots = 3, max_tokens = 600;
  for (int D : {64, 24, 30, 128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(D));
    CudaKVCache kv(1, NKVH, D, slots, max_tokens);
    const KVLayerView L = kv.layer(0);
    std::mt19937 rng(D);
    const int len = 530;  // more than two 256-key tiles
    // Fill slot 1 with random K/V for positions [0, len).
    std::vector<float> kf, vf;
    std::vector<uint16_t> kb = random_bf16(size_t(NKVH) * max_tokens * D, rng, 1.0f, &kf);
    std::vector<uint16_t> vb = random_bf16(size_t(NKVH) * max_tokens * D, rng, 1.0f, &vf);
    DSINFER_CUDA_CHECK(cudaMemcpy(L.k + L.slot_stride, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
    DSINFER_CUDA_CHECK(cudaMemcpy(L.v + L.slot_stride, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
    const std::vector<int32_t> slot = {1, 1, -1, 1}, pos = {0, 300, 0, len - 1};
    const int T = 4;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(size_t(T) * NH * D);
    for (auto& v : q) v = nd(rng);
    Dev<float> dq(q);
    Dev<int32_t> ds(slot), dp(pos);
    Dev<uint16_t> out(size_t(T) * NH * D);
    out.poison();
    const float scale = 1.0f / std::sqrt(float(D));
    attention_rows(dq.p, L, ds.p, dp.p, T, NH, NKVH, D, scale, reinterpret_cast<bf16*>(out.p), nullptr);
    const std::vector<uint16_t> o = out.get();
    for (int r = 0; r < T; ++r)
      for (int h = 0; h < NH; ++h) {
        const uint16_t* orow = o.data() + (size_t(r) * NH + h) * D;
        if (slot[r] < 0) {
          for (int d = 0; d < D; ++d) ASSERT_EQ(bf16_to_f32(orow[d]), 0.0f);
          continue;
        }
        const int g = h / (NH / NKVH), n = pos[r] + 1;
        std::vector<double> sc(n);
        double mx = -1e300;
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[(size_t(r) * NH + h) * D + d]) * kf[(size_t(g) * max_tokens + j) * D + d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (auto& s : sc) z += (s = std::exp(s - mx));
        for (int d = 0; d < D; ++d) {
          double ref = 0;
          for (int j = 0; j < n; ++j) ref += sc[j] / z * vf[(size_t(g) * max_tokens + j) * D + d];
          ASSERT_NEAR(bf16_to_f32(orow[d]), ref, std::abs(ref) / 128 + 2e-3) << "row " << r << " head " << h << " d " << d;
        }
      }
    // Row 3 alone: same bits.
    Dev<float> dq1(std::vector<float>(q.begin() + size_t(3) * NH * D, q.end()));
    Dev<int32_t> ds1(std::vector<int32_t>{1}), dp1(std::vector<int32_t>{len - 1});
    Dev<uint16_t> out1(size_t(NH) * D);
    attention_rows(dq1.p, L, ds1.p, dp1.p, 1, NH, NKVH, D, scale, reinterpret_cast<bf16*>(out1.p), nullptr);
    const std::vector<uint16_t> o1 = out1.get();
    ASSERT_EQ(0, std::memcmp(o1.data(), o.data() + size_t(3) * NH * D, size_t(NH) * D * 2));
  }
}

TEST(CudaKernels, ArgmaxTakesLowestIndexOnTies) {
  SKIP_WITHOUT_GPU();
  const int V = 5000;
  std::vector<float> l(3 * V, -1.0f);
  l[0 * V + 4321] = 3.0f;
  l[1 * V + 17] = 2.0f;
  l[1 * V + 4000] = 2.0f;  // tie: 17 wins
  l[2 * V + V - 1] = -0.5f;
  Dev<float> dl(l);
  Dev<int32_t> ids(3);
  argmax_rows(dl.p, 3, V, ids.p, nullptr);
  EXPECT_EQ(ids.get(), (std::vector<int32_t>{4321, 17, V - 1}));
}

// Sampling and rejection sampling on the device (cuda_sampling.h) against the host rule
// (spec/verify.h over sampling/sampler.h) with the same uniforms: every decision and every
// drawn token equal, and the Rng left where the host leaves it. Temperature alone, top-k,
// top-p, both, the extremes (top-k 1, a tiny top-p) and greedy; drafts with the drafter's q
// rows and with point masses; logit rows with exact ties (the host orders them by lower id);
// a small vocabulary and the 4B model's (151 936).
TEST(CudaKernels, SamplingAndRejectionSamplingMatchTheHostRule) {
  SKIP_WITHOUT_GPU();
  std::vector<SamplingParams> cfgs(7);
  cfgs[0].temperature = 0.8f;
  cfgs[1].temperature = 1.0f, cfgs[1].top_k = 40;
  cfgs[2].temperature = 0.7f, cfgs[2].top_p = 0.9f;
  cfgs[3].temperature = 1.3f, cfgs[3].top_k = 300, cfgs[3].top_p = 0.75f;
  cfgs[4].temperature = 1.0f, cfgs[4].top_k = 1;
  cfgs[5].temperature = 1.0f, cfgs[5].top_p = 0.02f;
  // cfgs[6]: greedy
  int rejected = 0, all_accepted = 0, accepted_some = 0, items_total = 0;
  for (int V : {1003, 151936}) {
    const int trials = V > 10000 ? 4 : 24;
    std::mt19937 gen(static_cast<unsigned>(V));
    std::normal_distribution<float> nd(0.0f, 2.5f);
    struct Item {
      SamplingParams p;
      std::vector<int32_t> drafts;
      std::vector<float> q;
      int row0 = 0;
      uint64_t seed = 0;
    };
    std::vector<Item> items;
    std::vector<float> logits;
    int rows = 0;
    Rng aux(static_cast<uint64_t>(V));
    for (size_t c = 0; c < cfgs.size(); ++c)
      for (int t = 0; t < trials; ++t) {
        Item it;
        it.p = cfgs[c];
        const int n = t % 5;
        it.row0 = rows;
        it.seed = 1000 + items.size();
        std::vector<float> pr, qr;
        for (int i = 0; i <= n; ++i) {
          std::vector<float> row(static_cast<size_t>(V));
          for (float& x : row) x = nd(gen);
          // Exact ties, the row's max among them: the host keeps the lower ids first.
          const int top = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
          for (int k = 0; k < 6; ++k) row[static_cast<size_t>(gen() % V)] = row[static_cast<size_t>(top)];
          for (int k = 0; k < 20; ++k) row[static_cast<size_t>(gen() % V)] = row[static_cast<size_t>(gen() % V)];
          logits.insert(logits.end(), row.begin(), row.end());
          ++rows;
          if (i == n) break;
          // Draft i + 1: drawn from q (the drafter's distribution: a perturbed row) when the item
          // carries q rows, else from p or at random (point masses).
          int32_t d;
          if (t % 2 == 1) {
            std::vector<float> pert(row);
            for (float& x : pert) x += 0.5f * nd(gen);
            SamplingParams qp;
            qp.temperature = 1.0f;
            sampling_distribution(pert.data(), V, qp, qr);
            d = sample_from(qr, aux);
            it.q.insert(it.q.end(), qr.begin(), qr.end());
          } else if (gen() % 10 < 7) {
            sampling_distribution(row.data(), V, it.p.greedy() ? cfgs[0] : it.p, pr);
            d = sample_from(pr, aux);
          } else {
            d = static_cast<int32_t>(gen() % V);
          }
          it.drafts.push_back(d);
        }
        items.push_back(std::move(it));
      }
    // Device inputs, as CudaQwen3Model::enqueue_verify builds them.
    std::vector<int32_t> dist_rows, drafts{0};
    std::vector<SampleParamsDev> params;
    std::vector<VerifyItemDev> dev_items;
    std::vector<double> uniforms;
    std::vector<float> q;
    for (const Item& it : items) {
      VerifyItemDev d;
      d.greedy = it.p.greedy();
      d.n = static_cast<int>(it.drafts.size());
      d.draft_off = static_cast<int>(drafts.size());
      d.row0 = it.row0;
      drafts.insert(drafts.end(), it.drafts.begin(), it.drafts.end());
      if (!d.greedy) {
        d.dist0 = static_cast<int>(dist_rows.size());
        for (int i = 0; i <= d.n; ++i) {
          dist_rows.push_back(it.row0 + i);
          params.push_back({it.p.temperature, it.p.top_k, it.p.top_p});
        }
        if (!it.q.empty()) {
          d.q_off = static_cast<int>(q.size() / V);
          q.insert(q.end(), it.q.begin(), it.q.end());
        }
        d.u_off = static_cast<int>(uniforms.size());
        Rng r(it.seed);
        for (int i = 0; i <= d.n; ++i) uniforms.push_back(r.uniform());
      }
      dev_items.push_back(d);
    }
    if (q.empty()) q.push_back(0.0f);
    if (dist_rows.empty()) dist_rows.push_back(0), params.push_back({});
    Dev<float> dl(logits), dq(q);
    Dev<unsigned long long> dk(static_cast<size_t>(rows));
    DSINFER_CUDA_CHECK(cudaMemset(dk.p, 0, dk.n * sizeof(unsigned long long)));
    argmax_keys_rows(dl.p, V, rows, V, dk.p, nullptr);
    Dev<int32_t> drows(dist_rows), ddrafts(drafts), dres(2 * dev_items.size());
    Dev<SampleParamsDev> dparams(params);
    Dev<RowDist> ddist(dist_rows.size());
    Dev<VerifyItemDev> ditems(dev_items);
    Dev<double> du(uniforms.empty() ? std::vector<double>{0.0} : uniforms);
    row_dist(dl.p, V, V, drows.p, dparams.p, static_cast<int>(dist_rows.size()), ddist.p, nullptr);
    verify_items(dl.p, V, V, dk.p, ddist.p, ditems.p, static_cast<int>(dev_items.size()), ddrafts.p, dq.p, du.p, dres.p,
                 nullptr);
    const std::vector<int32_t> res = dres.get();
    for (size_t k = 0; k < items.size(); ++k) {
      const Item& it = items[k];
      const int n = static_cast<int>(it.drafts.size());
      Rng hr(it.seed);
      const VerifyResult ref = verify_drafts(logits.data() + static_cast<size_t>(it.row0) * V, V, it.drafts, it.q, it.p, hr);
      EXPECT_EQ(res[2 * k], ref.accepted) << "V " << V << " item " << k << " (config " << k / trials << ")";
      EXPECT_EQ(res[2 * k + 1], ref.next_token) << "V " << V << " item " << k << " (config " << k / trials << ")";
      // The model advances the request's Rng by the draws verify_drafts made.
      Rng dr(it.seed);
      if (!it.p.greedy()) {
        const int used = res[2 * k] < n ? res[2 * k] + 2 : n + 1;
        for (int i = 0; i < used; ++i) dr.uniform();
      }
      EXPECT_EQ(dr.next_u64(), hr.next_u64()) << "V " << V << " item " << k;
      ++items_total;
      if (n > 0 && !it.p.greedy()) {
        rejected += ref.accepted < n;
        all_accepted += ref.accepted == n;
        accepted_some += ref.accepted > 0;
      }
    }
  }
  std::printf("[cuda sampling] %d items: %d with a rejection, %d fully accepted, %d with an accepted draft\n",
              items_total, rejected, all_accepted, accepted_some);
  EXPECT_GT(rejected, 10);
  EXPECT_GT(all_accepted, 5);
}

// DeepSeek-V4's block-quantized weights (FP8 E4M3 with 128x128 E8M0 scales, FP4 E2M1 with
// per-32 E8M0 scales) dequantised inside the GEMV: against the CPU's matmul_quant (same
// exact dequantisation, another summation order), for shapes with partial scale blocks;
// a row's bits do not depend on how many rows of x share the launch; a bad shape is a
// one-line error. Then, informational only, the bandwidth of V4-sized matrices (printed,
// never asserted).
TEST(CudaKernels, QuantGemvMatchesCpuAndIsBatchInvariant) {
  {
    QuantDeviceMatrix bad;
    bad.rows = 4;
    bad.cols = 1000;
    EXPECT_THROW(check_quant_gemv_shape(bad), Error);
    bad.format = QuantFormat::Fp4Group32;
    bad.cols = 48;
    try {
      check_quant_gemv_shape(bad);
      ADD_FAILURE() << "FP4 with 48 columns accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
    }
  }
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  struct Shape {
    QuantFormat f;
    int64_t rows, cols;
  };
  for (const Shape sh : {Shape{QuantFormat::Fp8Block128, 300, 1040}, Shape{QuantFormat::Fp8Block128, 129, 4096},
                         Shape{QuantFormat::Fp4Group32, 257, 2048}, Shape{QuantFormat::Fp4Group32, 64, 7168}}) {
    const bool fp4 = sh.f == QuantFormat::Fp4Group32;
    const int64_t code_bytes = fp4 ? sh.rows * sh.cols / 2 : sh.rows * sh.cols;
    const int64_t scale_bytes = fp4 ? sh.rows * (sh.cols / 32) : ((sh.rows + 127) / 128) * ((sh.cols + 127) / 128);
    std::vector<uint8_t> codes(static_cast<size_t>(code_bytes)), scales(static_cast<size_t>(scale_bytes));
    for (uint8_t& c : codes) {
      c = static_cast<uint8_t>(rng());
      if (!fp4 && (c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
    }
    for (uint8_t& e : scales) e = static_cast<uint8_t>(118 + rng() % 16);
    QuantWeightView hw;
    hw.format = sh.f;
    hw.data = codes.data();
    hw.scales = scales.data();
    hw.rows = sh.rows;
    hw.cols = sh.cols;
    const int m = 11;  // two launches of up to 8 rows
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(m * sh.cols));
    for (float& v : x) v = nd(rng);
    std::vector<float> want(static_cast<size_t>(m * sh.rows));
    matmul_quant(x.data(), m, hw, want.data());
    Dev<uint8_t> dc(codes), ds(scales);
    Dev<float> dx(x), dy(static_cast<size_t>(m * sh.rows)), dy1(static_cast<size_t>(sh.rows));
    QuantDeviceMatrix dw;
    dw.format = sh.f;
    dw.codes = dc.p;
    dw.scales = ds.p;
    dw.rows = sh.rows;
    dw.cols = sh.cols;
    dy.poison();
    quant_gemv(dw, dx.p, m, dy.p, nullptr);
    // Row 9 of x alone (a launch of one row) against row 9 inside the 11-row call.
    quant_gemv(dw, dx.p + 9 * sh.cols, 1, dy1.p, nullptr);
    DSINFER_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = dy.get(), alone = dy1.get();
    std::vector<float> wrow(static_cast<size_t>(sh.cols));
    double worst = 0;
    for (int64_t j = 0; j < sh.rows; ++j) {
      quant_row_to_f32(hw, j, wrow.data());
      for (int i = 0; i < m; ++i) {
        double mag = 0;
        for (int64_t k = 0; k < sh.cols; ++k) mag += std::fabs(static_cast<double>(x[i * sh.cols + k]) * wrow[k]);
        const double err = std::fabs(static_cast<double>(got[i * sh.rows + j]) - want[i * sh.rows + j]) / (mag + 1e-30);
        worst = std::max(worst, err);
      }
      ASSERT_EQ(std::memcmp(&alone[j], &got[9 * sh.rows + j], sizeof(float)), 0)
          << "row " << j << ": one row of x alone differs from the same row among 11";
    }
    EXPECT_LT(worst, 1e-5) << (fp4 ? "FP4 " : "FP8 ") << sh.rows << "x" << sh.cols;
    std::printf("[quant gemv] %s %lldx%lld: worst error %.2e of sum |x w|\n", fp4 ? "FP4" : "FP8",
                static_cast<long long>(sh.rows), static_cast<long long>(sh.cols), worst);
  }
  // Bandwidth (informational): one row of x against V4-Flash-sized matrices.
  for (const Shape sh : {Shape{QuantFormat::Fp8Block128, 7168, 4096}, Shape{QuantFormat::Fp8Block128, 32768, 1024},
                         Shape{QuantFormat::Fp4Group32, 4096, 7168}, Shape{QuantFormat::Fp4Group32, 7168, 2048}}) {
    const bool fp4 = sh.f == QuantFormat::Fp4Group32;
    const size_t code_bytes = static_cast<size_t>(fp4 ? sh.rows * sh.cols / 2 : sh.rows * sh.cols);
    const size_t scale_bytes = static_cast<size_t>(fp4 ? sh.rows * (sh.cols / 32) : ((sh.rows + 127) / 128) * ((sh.cols + 127) / 128));
    // 16 copies, cycled, so each call streams from HBM rather than the 60 MB L2.
    constexpr int kCopies = 16;
    Dev<uint8_t> dc(code_bytes * kCopies), ds(scale_bytes * kCopies);
    DSINFER_CUDA_CHECK(cudaMemset(dc.p, 0x11, code_bytes * kCopies));
    DSINFER_CUDA_CHECK(cudaMemset(ds.p, 127, scale_bytes * kCopies));
    Dev<float> dx(static_cast<size_t>(sh.cols)), dy(static_cast<size_t>(sh.rows));
    DSINFER_CUDA_CHECK(cudaMemset(dx.p, 0, sizeof(float) * sh.cols));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    auto run = [&](int i) {
      QuantDeviceMatrix dw{sh.f, dc.p + (i % kCopies) * code_bytes, ds.p + (i % kCopies) * scale_bytes, sh.rows, sh.cols};
      quant_gemv(dw, dx.p, 1, dy.p, nullptr);
    };
    for (int i = 0; i < kCopies; ++i) run(i);
    cudaEventRecord(a);
    constexpr int kReps = 64;
    for (int i = 0; i < kReps; ++i) run(i);
    cudaEventRecord(b);
    DSINFER_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    const double per = ms / kReps;
    std::printf("[quant gemv bandwidth] %s %lldx%lld (%.1f MB): %.2f us, %.0f GB/s\n", fp4 ? "FP4" : "FP8",
                static_cast<long long>(sh.rows), static_cast<long long>(sh.cols), (code_bytes + scale_bytes) / 1e6,
                per * 1e3, (code_bytes + scale_bytes) / (per * 1e-3) / 1e9);
  }
}

// The tensor-core GEMM (GemvShape::mma, experimental): a row's bits do not depend on how many
// rows share the call (1 to 40: one to three row groups, the row at any place of the 16-row
// fragment), for every input kind and both epilogues; its values agree with the CUDA-core row
// kernel's within rounding (a wrong fragment layout or k permutation would be off by O(1)).
// K = 9728 holds 11 rows per block; K = 320 is the embedded target's hidden size.
TEST(CudaKernels, MmaGemmIsBatchInvariant) {
  SKIP_WITHOUT_GPU();
  for (auto [K0, N0] : {std::pair{2560, 1030}, std::pair{320, 1792}, std::pair{9728, 264}}) {
    const int K = K0, N = N0;
    SCOPED_TRACE("K " + std::to_string(K) + ", N " + std::to_string(N));
    std::mt19937 rng(7);
    const int M = 40;
    const GemmInputs g(M, K, N, rng);
    const Dev<float>& dx = *g.dx;
    const Dev<float>& dnw = *g.dnw;
    const Dev<float>& dgu = *g.dgu;
    const Dev<uint16_t>& W = *g.W;
    std::vector<uint16_t> xb(size_t(M) * K);
    for (size_t i = 0; i < xb.size(); ++i) xb[i] = f32_to_bf16(g.x[i]);
    Dev<uint16_t> dxb(xb);
    const GemvShape saved = gemv_shape();
    struct Out {
      std::vector<float> norm, bf, swiglu_in;
      std::vector<uint16_t> act;
      std::vector<unsigned long long> keys;
    };
    auto run = [&](bool mma, int m) {
      GemvShape shape;
      shape.mma = mma;
      set_gemv_shape(shape);
      Out o;
      const GemmInput in = GemmInput::rmsnorm_rows(dx.p, K, dnw.p, 1e-6f);
      Dev<float> Y(size_t(m) * N);
      Dev<unsigned long long> keys(m);
      DSINFER_CUDA_CHECK(cudaMemset(keys.p, 0, m * sizeof(unsigned long long)));
      gemm_rows(in, as_bf16(W.p), N, K, Y.p, N, m, false, nullptr, keys.p);
      o.norm = Y.get();
      o.keys = keys.get();
      gemm_rows(GemmInput::bf16_rows(as_bf16(dxb.p), K), as_bf16(W.p), N, K, Y.p, N, m, true, nullptr);
      o.bf = Y.get();  // accumulated onto the first
      gemm_rows(GemmInput::silu_mul_rows(dgu.p, 2 * K), as_bf16(W.p), N, K, Y.p, N, m, false, nullptr);
      o.swiglu_in = Y.get();
      Dev<uint16_t> act(size_t(m) * N / 2);
      gemm_rows_silu(in, as_bf16(W.p), N, K, reinterpret_cast<bf16*>(act.p), N / 2, m, nullptr);
      o.act = act.get();
      return o;
    };
    const Out all = run(true, M);
    for (int m : {1, 2, 5, 13, 16, 17, 33}) {
      SCOPED_TRACE("rows " + std::to_string(m));
      const Out o = run(true, m);
      EXPECT_EQ(0, std::memcmp(o.norm.data(), all.norm.data(), o.norm.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(o.bf.data(), all.bf.data(), o.bf.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(o.swiglu_in.data(), all.swiglu_in.data(), o.swiglu_in.size() * sizeof(float)));
      EXPECT_TRUE(std::equal(o.act.begin(), o.act.end(), all.act.begin()));
      EXPECT_TRUE(std::equal(o.keys.begin(), o.keys.end(), all.keys.begin()));
    }
    const Out fma = run(false, M);
    double worst = 0;
    for (size_t i = 0; i < fma.norm.size(); ++i) {
      worst = std::max(worst, std::fabs(double(all.norm[i]) - fma.norm[i]) / (1.0 + std::fabs(fma.norm[i])));
      worst = std::max(worst, std::fabs(double(all.bf[i]) - fma.bf[i]) / (1.0 + std::fabs(fma.bf[i])));
      worst = std::max(worst, std::fabs(double(all.swiglu_in[i]) - fma.swiglu_in[i]) / (1.0 + std::fabs(fma.swiglu_in[i])));
    }
    std::printf("[mma gemm] K %d N %d: worst |mma - row kernel| / (1 + |row kernel|) %.3g\n", K, N, worst);
    EXPECT_LT(worst, 1e-2);
    set_gemv_shape(saved);
  }
}

#else
TEST(CudaKernels, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without DSINFER_CUDA"; }
#endif
