// Model floor: DeepSeek-V4 block-quantized weights (FP8 E4M3 with 128×128 scales, FP4 E2M1
// with per-32 scales), dequantised on the fly inside the matmul.
//
// 1. Kernel: matmul_quant against "dequantise to F32, then an F32 matmul" (the reference
//    dequantisation is written here independently from the format definitions), plus
//    known code values and batch invariance (m = 1 vs m = 7 rows give the same bits).
// 2. Model: the committed tiny V4 checkpoint with its attention projections and shared
//    experts rewritten as FP8 and its routed experts as FP4 (gate/up) / FP8 (down), next to
//    the same model with those dequantised values stored as F32. Both load; logits agree
//    to F32 rounding (only the reduction order differs). FP8 codes and their scales are
//    stored under safetensors' own F8_E4M3 / F8_E8M0 names, FP4 codes as U8 bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <deque>
#include <random>
#include <unistd.h>

#include "backend/cuda/quant_decode.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_quant.h"
#include "model/model.h"
#include "model/safetensors.h"

using namespace dsinfer;

namespace {

// Independent decoders, straight from the format tables.
double ref_e4m3(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}
double ref_e2m1(uint8_t n) {
  const double t[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (n & 8) ? -t[n & 7] : t[n & 7];
}
double ref_e8m0(uint8_t e) { return std::pow(2.0, static_cast<int>(e) - 127); }

// Random E4M3 code with magnitude < 2 (exponent field ≤ 7), never NaN.
uint8_t rand_fp8(std::mt19937& g) { return static_cast<uint8_t>((g() & 0x80) | ((g() % 8) << 3) | (g() & 7)); }

struct Quantized {
  std::vector<uint8_t> codes, scales;
  std::vector<float> dequant;  // [rows, cols]
};

Quantized make_fp8(int64_t rows, int64_t cols, std::mt19937& g, int exp_center) {
  Quantized q;
  q.codes.resize(rows * cols);
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  q.scales.resize(sr * sc);
  for (auto& c : q.codes) c = rand_fp8(g);
  for (auto& s : q.scales) s = static_cast<uint8_t>(127 + exp_center + static_cast<int>(g() % 3) - 1);
  q.dequant.resize(rows * cols);
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < cols; ++i)
      q.dequant[o * cols + i] = static_cast<float>(ref_e4m3(q.codes[o * cols + i]) * ref_e8m0(q.scales[(o / 128) * sc + i / 128]));
  return q;
}

Quantized make_fp4(int64_t rows, int64_t cols, std::mt19937& g, int exp_center) {
  Quantized q;
  q.codes.resize(rows * cols / 2);
  q.scales.resize(rows * cols / 32);
  for (auto& c : q.codes) c = static_cast<uint8_t>(g() & 0xff);
  for (auto& s : q.scales) s = static_cast<uint8_t>(127 + exp_center + static_cast<int>(g() % 3) - 1);
  q.dequant.resize(rows * cols);
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < cols; ++i) {
      const uint8_t byte = q.codes[o * (cols / 2) + i / 2];
      const uint8_t nib = (i % 2) ? byte >> 4 : byte & 15;
      q.dequant[o * cols + i] = static_cast<float>(ref_e2m1(nib) * ref_e8m0(q.scales[o * (cols / 32) + i / 32]));
    }
  return q;
}

void expect_close_to_f32_matmul(const Quantized& q, const QuantWeightView& w, int64_t m, std::mt19937& g) {
  std::vector<float> x(m * w.cols), y(m * w.rows), ref(m * w.rows);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(g);
  matmul_quant(x.data(), m, w, y.data());
  matmul(x.data(), m, WeightView{q.dequant.data(), DType::F32, w.rows, w.cols}, ref.data());
  for (int64_t i = 0; i < m * w.rows; ++i) {
    double mag = 0;  // Σ|x·w| bounds the rounding of either order
    const int64_t r = i / w.rows, o = i % w.rows;
    for (int64_t k = 0; k < w.cols; ++k) mag += std::abs(double(x[r * w.cols + k]) * q.dequant[o * w.cols + k]);
    ASSERT_NEAR(y[i], ref[i], 1e-5 * mag + 1e-30) << "element " << i;
  }
  // Batch invariance: row 0 alone gives the same bits as inside the m-row call.
  std::vector<float> y1(w.rows);
  matmul_quant(x.data(), 1, w, y1.data());
  EXPECT_EQ(std::memcmp(y1.data(), y.data(), w.rows * sizeof(float)), 0);
}

}  // namespace

TEST(ModelDeepseekV4Quant, ScalarDecodersMatchTheFormats) {
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) == 0x7f) continue;  // NaN codes
    EXPECT_EQ(e4m3_to_f32(static_cast<uint8_t>(v)), static_cast<float>(ref_e4m3(v))) << v;
  }
  for (int n = 0; n < 16; ++n) EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(n)), static_cast<float>(ref_e2m1(n))) << n;
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
}

TEST(ModelDeepseekV4Quant, Fp8BlockMatmulEqualsDequantisedF32) {
  std::mt19937 g(11);
  // 300 × 260: partial last scale blocks in both directions.
  const Quantized q = make_fp8(300, 260, g, -3);
  const QuantWeightView w{QuantFormat::Fp8Block128, q.codes.data(), q.scales.data(), 300, 260};
  expect_close_to_f32_matmul(q, w, 7, g);
  std::vector<float> row(260);
  quant_row_to_f32(w, 299, row.data());
  EXPECT_EQ(std::memcmp(row.data(), q.dequant.data() + 299 * 260, sizeof(float) * 260), 0);
  EXPECT_EQ(quant_weight_bytes(w), 300u * 260u + 3u * 3u);
}

TEST(ModelDeepseekV4Quant, Fp4GroupMatmulEqualsDequantisedF32) {
  std::mt19937 g(12);
  const Quantized q = make_fp4(70, 96, g, -4);
  const QuantWeightView w{QuantFormat::Fp4Group32, q.codes.data(), q.scales.data(), 70, 96};
  expect_close_to_f32_matmul(q, w, 5, g);
  const QuantWeightView bad{QuantFormat::Fp4Group32, q.codes.data(), q.scales.data(), 70, 48};
  std::vector<float> x(48), y(70);
  EXPECT_THROW(matmul_quant(x.data(), 1, bad, y.data()), Error);
}

namespace {

struct TmpDir {
  std::filesystem::path p;
  explicit TmpDir(const char* tag) {
    p = std::filesystem::temp_directory_path() / (std::string("dsinfer_v4q_") + tag + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
};

}  // namespace

TEST(ModelDeepseekV4Quant, QuantizedCheckpointMatchesItsDequantisedTwin) {
  const std::filesystem::path src = std::filesystem::path(DSINFER_TEST_DATA) / "deepseek_v4" / "mixed4_f32";
  SafetensorsFile f((src / "model.safetensors").string());
  TmpDir qdir("q"), fdir("f");
  std::mt19937 g(5);
  // Keep every item's bytes alive until written.
  std::deque<std::vector<uint8_t>> keep;
  std::vector<SafetensorsWriteItem> qitems, fitems;
  auto add_raw = [&](std::vector<SafetensorsWriteItem>& items, const std::string& name, DType dt,
                     std::vector<int64_t> shape, const void* data, size_t n) {
    keep.emplace_back(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
    items.push_back({name, dt, std::move(shape), keep.back().data(), nullptr});
  };
  auto add_f32 = [&](std::vector<SafetensorsWriteItem>& items, const std::string& name, std::vector<int64_t> shape,
                     const std::vector<float>& v) { add_raw(items, name, DType::F32, std::move(shape), v.data(), v.size() * 4); };
  int n_fp8 = 0, n_fp4 = 0;
  auto fp8_of = [](const std::string& n) {
    for (const char* k : {"q_a_proj.weight", "q_b_proj.weight", "self_attn.kv_proj.weight", "o_b_proj.weight",
                          "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"})
      if (n.size() >= std::strlen(k) && n.compare(n.size() - std::strlen(k), std::strlen(k), k) == 0) return true;
    return false;
  };
  for (const auto& t : f.header().tensors) {
    const uint8_t* data = f.tensor_data(t);
    const bool experts_gu = t.name.find("mlp.experts.gate_up_proj") != std::string::npos;
    const bool experts_dn = t.name.find("mlp.experts.down_proj") != std::string::npos;
    if (experts_gu || experts_dn) {
      // Unstack into per-expert tensors: gate/up FP4 (cols = D = 32), down FP8.
      const std::string base = t.name.substr(0, t.name.find("gate_up_proj") == std::string::npos ? t.name.find("down_proj")
                                                                                                 : t.name.find("gate_up_proj"));
      const int64_t E = t.shape[0];
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = base + std::to_string(e) + ".";
        if (experts_gu) {
          const int64_t I = t.shape[1] / 2, D = t.shape[2];
          for (const char* w : {"w1", "w3"}) {
            const Quantized q = make_fp4(I, D, g, -3);
            add_raw(qitems, ep + w + ".weight", DType::U8, {I, D / 2}, q.codes.data(), q.codes.size());
            add_raw(qitems, ep + w + ".weight_scale_inv", DType::U8, {I, D / 32}, q.scales.data(), q.scales.size());
            add_f32(fitems, ep + w + ".weight", {I, D}, q.dequant);
            ++n_fp4;
          }
        } else {
          const int64_t D = t.shape[1], I = t.shape[2];
          const Quantized q = make_fp8(D, I, g, -3);
          add_raw(qitems, ep + "w2.weight", DType::F8E4M3, {D, I}, q.codes.data(), q.codes.size());
          add_raw(qitems, ep + "w2.weight_scale_inv", DType::F8E8M0, {(D + 127) / 128, (I + 127) / 128}, q.scales.data(),
                  q.scales.size());
          add_f32(fitems, ep + "w2.weight", {D, I}, q.dequant);
          ++n_fp8;
        }
      }
      continue;
    }
    if (fp8_of(t.name)) {
      const Quantized q = make_fp8(t.shape[0], t.shape[1], g, -4);
      add_raw(qitems, t.name, DType::U8, t.shape, q.codes.data(), q.codes.size());
      add_raw(qitems, t.name + "_scale_inv", DType::U8, {(t.shape[0] + 127) / 128, (t.shape[1] + 127) / 128},
              q.scales.data(), q.scales.size());
      add_f32(fitems, t.name, t.shape, q.dequant);
      ++n_fp8;
      continue;
    }
    add_raw(qitems, t.name, t.dtype, t.shape, data, t.nbytes);
    add_raw(fitems, t.name, t.dtype, t.shape, data, t.nbytes);
  }
  ASSERT_GT(n_fp8, 20);
  ASSERT_GT(n_fp4, 20);
  write_safetensors((qdir.p / "model.safetensors").string(), qitems);
  write_safetensors((fdir.p / "model.safetensors").string(), fitems);
  for (const auto& d : {qdir.p, fdir.p}) std::filesystem::copy_file(src / "config.json", d / "config.json");

  auto mq = load_model(qdir.p.string());
  auto mf = load_model(fdir.p.string());
  EXPECT_LT(mq->decode_weight_bytes(), mf->decode_weight_bytes());  // codes stay 1 or ½ byte per weight
  const int V = mq->config().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 30; ++i) ids.push_back(3 + (i * 37) % (V - 3));
  ForwardBatch b;
  b.entries.push_back({0, ids, {}});
  for (int i = 0; i < 30; ++i) b.entries[0].logit_rows.push_back(i);
  ForwardOutput oq, of;
  auto kq = mq->make_kv_cache(1, 64), kf = mf->make_kv_cache(1, 64);
  mq->forward(*kq, b, oq);
  mf->forward(*kf, b, of);
  ASSERT_EQ(oq.logits.size(), of.logits.size());
  double worst = 0, scale = 1;
  for (size_t i = 0; i < of.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(oq.logits[i]));
    worst = std::max(worst, std::abs(double(oq.logits[i]) - of.logits[i]));
    scale = std::max(scale, std::abs(double(of.logits[i])));
  }
  EXPECT_LE(worst, 1e-4 * scale) << "worst |diff| " << worst;
}

// The CUDA quantized GEMV's decoders (backend/cuda/quant_decode.h, bit arithmetic shared by
// host and device) equal the CPU kernel's for every code: every E4M3 and E8M0 byte and
// every E2M1 nibble, bit for bit (NaN as NaN). Runs in every build, GPU or not.
TEST(V4Quant, DeviceDecodersEqualTheCpuDecodersForEveryCode) {
  auto same = [](float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return std::memcmp(&a, &b, sizeof a) == 0;
  };
  for (uint32_t v = 0; v < 256; ++v) {
    EXPECT_TRUE(same(quant_decode::e4m3(v), e4m3_to_f32(static_cast<uint8_t>(v))))
        << "E4M3 code " << v << ": " << quant_decode::e4m3(v) << " vs " << e4m3_to_f32(static_cast<uint8_t>(v));
    EXPECT_TRUE(same(quant_decode::e8m0(v), e8m0_to_f32(static_cast<uint8_t>(v)))) << "E8M0 code " << v;
  }
  for (uint32_t n = 0; n < 16; ++n)
    EXPECT_TRUE(same(quant_decode::e2m1(n), e2m1_to_f32(static_cast<uint8_t>(n))))
        << "E2M1 code " << n << ": " << quant_decode::e2m1(n) << " vs " << e2m1_to_f32(static_cast<uint8_t>(n));
}
