// dsinfer kernels: block-quantized matmul (see matmul_quant.h). Scalar on purpose: the
// point is exact, batch-invariant results without ever materialising a BF16/F32 copy of
// the matrix; each thread owns one dequantised row of scratch at a time.
#include "kernels/cpu/matmul_quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dsinfer {

float e4m3_to_f32(uint8_t v) {
  // E4M3 (OCP "fn" variant): 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities,
  // S.1111.111 is NaN; subnormals when the exponent field is 0.
  const int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 0x7;
  float mag;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  if (exp == 0) mag = std::ldexp(static_cast<float>(man), -9);  // man/8 · 2^-6
  else mag = std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

float e2m1_to_f32(uint8_t nibble) {
  static const float table[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return table[nibble & 0xf];
}

void quant_row_to_f32(const QuantWeightView& w, int64_t row, float* out) {
  if (row < 0 || row >= w.rows) throw Error("quant_row_to_f32: row " + std::to_string(row) + " out of range");
  if (w.format == QuantFormat::Fp8Block128) {
    const int64_t sb_cols = (w.cols + 127) / 128;
    const uint8_t* q = w.data + row * w.cols;
    const uint8_t* s = w.scales + (row / 128) * sb_cols;
    for (int64_t i = 0; i < w.cols; ++i) out[i] = e4m3_to_f32(q[i]) * e8m0_to_f32(s[i / 128]);
  } else {
    const uint8_t* q = w.data + row * (w.cols / 2);
    const uint8_t* s = w.scales + row * (w.cols / 32);
    for (int64_t j = 0; j < w.cols / 2; ++j) {
      const float sc = e8m0_to_f32(s[(2 * j) / 32]);
      out[2 * j] = e2m1_to_f32(q[j] & 0xf) * sc;
      out[2 * j + 1] = e2m1_to_f32(q[j] >> 4) * sc;
    }
  }
}

uint64_t quant_weight_bytes(const QuantWeightView& w) {
  if (w.format == QuantFormat::Fp8Block128)
    return static_cast<uint64_t>(w.rows * w.cols + ((w.rows + 127) / 128) * ((w.cols + 127) / 128));
  return static_cast<uint64_t>(w.rows * (w.cols / 2) + w.rows * (w.cols / 32));
}

void matmul_quant(const float* x, int64_t m, const QuantWeightView& w, float* y, ThreadPool* pool) {
  if (w.rows <= 0 || w.cols <= 0) throw Error("matmul_quant: empty weight");
  if (w.format == QuantFormat::Fp4Group32 && w.cols % 32 != 0)
    throw Error("matmul_quant: FP4 weight with " + std::to_string(w.cols) + " columns (must be a multiple of 32)");
  if (m <= 0) return;
  if (!pool) pool = &ThreadPool::global();
  const int64_t K = w.cols, N = w.rows;
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, 65536 / std::max<int64_t>(1, K * m)));
  pool->parallel_for(
      static_cast<size_t>(N),
      [&](size_t lo, size_t hi) {
        std::vector<float> row(static_cast<size_t>(K));
        for (size_t j = lo; j < hi; ++j) {
          quant_row_to_f32(w, static_cast<int64_t>(j), row.data());
          for (int64_t i = 0; i < m; ++i) {
            const float* xi = x + i * K;
            float acc = 0.0f;
            for (int64_t k = 0; k < K; ++k) acc = std::fma(xi[k], row[k], acc);
            y[i * N + static_cast<int64_t>(j)] = acc;
          }
        }
      },
      grain);
}

}  // namespace dsinfer
