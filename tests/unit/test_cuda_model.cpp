// CUDA backend: the Qwen3 model on the GPU. Conformance with the transformers goldens
// (tests/data/qwen3, within BF16 tolerance), agreement with the CPU engine on the embedded
// target, and the determinism contract: a row's logits are bit-identical whether it runs
// alone or batched with other sequences, as one token or inside a multi-token verify
// block, and with or without CUDA graphs. Skipped without DSINFER_CUDA or without a GPU.
#include <gtest/gtest.h>

#ifdef DSINFER_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_nccl.h"
#include "cuda_test_util.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/block_kv_cache.h"
#include "model/safetensors.h"
#include "model/weights.h"

using namespace dsinfer;

namespace {

const std::string kQwen3Dir = std::string(DSINFER_TEST_DATA) + "/qwen3";
const std::string kEmbedded = std::string(DSINFER_SOURCE_DIR) + "/models/embedded/target";

std::vector<std::string> golden_dirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  if (!std::filesystem::is_directory(kQwen3Dir, ec)) return dirs;
  for (const auto& e : std::filesystem::directory_iterator(kQwen3Dir))
    if (std::filesystem::exists(e.path() / "golden.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

int argmax(const float* x, int n) {
  int b = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return b;
}

std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int n) {
  auto kv = m.make_kv_cache(1, static_cast<int>(prompt.size()) + n + 1);
  ForwardBatch b;
  b.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
  ForwardOutput out;
  std::vector<int32_t> ids, gen;
  m.forward_argmax(*kv, b, out, ids);
  while (static_cast<int>(gen.size()) < n) {
    gen.push_back(ids.at(0));
    b.entries[0] = {0, {ids[0]}, {0}};
    m.forward_argmax(*kv, b, out, ids);
  }
  return gen;
}

// The bias-free test models (and the embedded target when present) and a token sequence
// for the one-row decode comparisons below.
std::vector<std::string> decode_test_dirs() {
  std::vector<std::string> dirs = {kQwen3Dir + "/bf16_weights", kQwen3Dir + "/tied_gqa2",
                                   kQwen3Dir + "/untied_gqa4_hd32", kQwen3Dir + "/yarn_gqa3"};
  if (std::filesystem::exists(kEmbedded + "/config.json")) dirs.push_back(kEmbedded);
  return dirs;
}
const std::vector<int32_t> kDecodeSeq = {5, 17, 99, 3, 42, 7, 250, 11, 64, 200, 12, 13, 14, 15, 16, 90, 91, 92, 1, 2};
constexpr int kDecodePrefix = 5;

// One sequence's cache in slot 0: dense, or paged over 22 scattered blocks of 3 positions.
std::unique_ptr<KVCache> decode_cache(Model& m, bool paged) {
  if (!paged) return m.make_kv_cache(1, 64);
  auto p = m.make_paged_kv_cache(3, 64, 1, 64, 0);
  std::vector<int32_t> table;
  for (int i = 0; i < 22; ++i) table.push_back(63 - 2 * i);  // scattered, descending
  p->bind(0, table, 0);
  return p;
}

// seq[0, prefix) prefilled into slot 0, then seq[prefix, end) one token per forward: the
// decode steps' logit rows, in order.
std::vector<float> prefill_then_decode(Model& m, KVCache& kv, const std::vector<int32_t>& seq, int prefix) {
  ForwardOutput out;
  ForwardBatch pre;
  pre.entries.push_back({0, std::vector<int32_t>(seq.begin(), seq.begin() + prefix), {}});
  m.forward(kv, pre, out);
  std::vector<float> rows;
  for (size_t i = prefix; i < seq.size(); ++i) {
    ForwardBatch d;
    d.entries.push_back({0, {seq[i]}, {0}});
    m.forward(kv, d, out);
    rows.insert(rows.end(), out.logits.begin(), out.logits.end());
  }
  return rows;
}

// kDecodeSeq decoded one row at a time after its prefix (decode_cache's layout), then a
// verify block over keys the one-row steps wrote (it reads them from the cache, so the cache
// contents are compared too): every logit row, in order.
std::vector<float> decode_then_verify(Model& m, bool paged) {
  std::unique_ptr<KVCache> kv = decode_cache(m, paged);
  std::vector<float> logits = prefill_then_decode(m, *kv, kDecodeSeq, kDecodePrefix);
  ForwardOutput out;
  ForwardBatch blk;
  blk.entries.push_back({0, {7, 8, 9}, {0, 1, 2}});
  m.forward(*kv, blk, out);
  logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  return logits;
}

// The model at dir loaded twice: with options field `on` set, and with it cleared.
std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> load_with_and_without(const std::string& dir,
                                                                                bool CudaModelOptions::*on,
                                                                                CudaModelOptions base = {}) {
  CudaModelOptions with = base, without = base;
  with.*on = true;
  without.*on = false;
  return {load_qwen3_cuda(dir, with), load_qwen3_cuda(dir, without)};
}

}  // namespace

// Logits at every prompt position within BF16 tolerance of transformers (F32): BF16
// activations into every GEMM and a BF16 KV cache cost about 2^-8 relative per rounding, so
// the bound is 4e-2 of the row's largest |logit| (the CPU's F32 path is held to 1e-4).
// Greedy ids are reported (printed), not required: a BF16 engine may flip near-ties.
TEST(CudaModel, TransformersGoldensWithinBf16Tolerance) {
  SKIP_WITHOUT_GPU();
  const auto dirs = golden_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto model = load_qwen3_cuda(dir);
    const int V = model->config().vocab_size;
    const auto golden = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
    SafetensorsFile ref(dir + "/golden_logits.safetensors");
    std::map<std::string, const SafetensorsTensor*> by_name;
    for (const auto& t : ref.header().tensors) by_name[t.name] = &t;
    double worst_rel = 0;
    int same = 0, total = 0;
    for (size_t p = 0; p < golden.at("prompts").size(); ++p) {
      const auto toks = golden["prompts"][p].get<std::vector<int32_t>>();
      const int n = static_cast<int>(toks.size());
      const uint8_t* rb = ref.tensor_data(*by_name.at("logits." + std::to_string(p)));
      auto kv = model->make_kv_cache(1, n + 1);
      ForwardBatch b;
      b.entries.push_back({0, toks, {}});
      for (int i = 0; i < n; ++i) b.entries[0].logit_rows.push_back(i);
      ForwardOutput out;
      model->forward(*kv, b, out);
      ASSERT_EQ(out.logits.size(), size_t(n) * V);
      for (int t = 0; t < n; ++t) {
        double scale = 1.0, worst = 0.0;
        for (int j = 0; j < V; ++j) scale = std::max(scale, std::abs(double(load_as_f32(rb, DType::F32, int64_t(t) * V + j))));
        for (int j = 0; j < V; ++j) {
          const double d = std::abs(double(out.logits[size_t(t) * V + j]) - load_as_f32(rb, DType::F32, int64_t(t) * V + j));
          ASSERT_FALSE(std::isnan(d));
          worst = std::max(worst, d);
        }
        worst_rel = std::max(worst_rel, worst / scale);
        EXPECT_LE(worst, 4e-2 * scale) << "prompt " << p << " position " << t;
      }
      const auto want = golden["greedy"][p].get<std::vector<int32_t>>();
      const auto got = greedy(*model, toks, static_cast<int>(want.size()));
      int k = 0;
      while (k < static_cast<int>(want.size()) && got[k] == want[k]) ++k;
      same += k;
      total += static_cast<int>(want.size());
    }
    std::cout << "[cuda golden] " << std::filesystem::path(dir).filename().string() << ": worst |diff|/scale "
              << worst_rel << ", greedy ids matching before the first difference " << same << "/" << total << "\n";
  }
}

// The determinism contract on the GPU: the same sequence decoded (a) alone, one token per
// forward, (b) batched with two other sequences of other lengths, (c) as one multi-token
// verify block, (d) without graphs: every logit row bit-identical.
TEST(CudaModel, BatchInvariantAcrossBatchBlockAndGraphs) {
  SKIP_WITHOUT_GPU();
  const std::string dir = kQwen3Dir + "/untied_gqa4_hd32";
  const std::vector<int32_t> a = {5, 17, 99, 3, 42, 7, 250, 11, 64, 300};
  const std::vector<int32_t> b_prompt = {8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const std::vector<int32_t> c_prompt = {200, 201};
  CudaModelOptions with_graphs, no_graphs;
  no_graphs.use_graphs = false;
  auto mg = load_qwen3_cuda(dir, with_graphs);
  auto mn = load_qwen3_cuda(dir, no_graphs);
  const int V = mg->config().vocab_size;
  const int prefix = 4;  // a[0..prefix) prefilled, the rest decoded / verified

  // (a) alone, one token per forward; run twice so that the second pass replays graphs.
  auto alone = [&](Model& m) {
    auto kv = m.make_kv_cache(1, 64);
    return prefill_then_decode(m, *kv, a, prefix);
  };
  const std::vector<float> ref = alone(*mn);
  ASSERT_EQ(ref.size(), (a.size() - prefix) * V);
  for (int pass = 0; pass < 3; ++pass) EXPECT_EQ(0, std::memcmp(alone(*mg).data(), ref.data(), ref.size() * 4)) << "graphs pass " << pass;

  // (b) batched with b and c (slots 2 and 0; a in slot 1), several passes (graphs).
  for (Model* m : {mn.get(), mg.get()}) {
    for (int pass = 0; pass < 2; ++pass) {
      auto kv = m->make_kv_cache(3, 64);
      ForwardOutput out;
      ForwardBatch pre;
      pre.entries.push_back({2, b_prompt, {}});
      pre.entries.push_back({1, std::vector<int32_t>(a.begin(), a.begin() + prefix), {}});
      pre.entries.push_back({0, c_prompt, {1}});
      m->forward(*kv, pre, out);
      std::vector<float> rows;
      for (size_t i = prefix; i < a.size(); ++i) {
        ForwardBatch d;
        d.entries.push_back({0, {static_cast<int32_t>(i)}, {0}});
        d.entries.push_back({1, {a[i]}, {0}});
        d.entries.push_back({2, {static_cast<int32_t>(2 * i)}, {0}});
        m->forward(*kv, d, out);
        rows.insert(rows.end(), out.logits.begin() + V, out.logits.begin() + 2 * V);
      }
      EXPECT_EQ(0, std::memcmp(rows.data(), ref.data(), ref.size() * 4)) << "batched, pass " << pass;
    }
  }

  // (c) one verify block over a[prefix .. end) after the same prefill: row i of the block
  // sits at the position of decode step i and must give the same bits.
  for (Model* m : {mn.get(), mg.get()}) {
    for (int pass = 0; pass < 2; ++pass) {
      auto kv = m->make_kv_cache(1, 64);
      ForwardOutput out;
      ForwardBatch pre;
      pre.entries.push_back({0, std::vector<int32_t>(a.begin(), a.begin() + prefix), {}});
      m->forward(*kv, pre, out);
      ForwardBatch blk;
      blk.entries.push_back({0, std::vector<int32_t>(a.begin() + prefix, a.end()), {}});
      for (size_t i = 0; i + prefix < a.size(); ++i) blk.entries[0].logit_rows.push_back(static_cast<int>(i));
      m->forward(*kv, blk, out);
      EXPECT_EQ(0, std::memcmp(out.logits.data(), ref.data(), ref.size() * 4)) << "verify block, pass " << pass;
    }
  }

  // forward_argmax returns the argmax of what forward returns.
  {
    auto kv = mg->make_kv_cache(1, 64);
    ForwardBatch pre;
    pre.entries.push_back({0, a, {0, 3, static_cast<int>(a.size()) - 1}});
    ForwardOutput out;
    std::vector<int32_t> ids;
    mg->forward_argmax(*kv, pre, out, ids);
    auto kv2 = mn->make_kv_cache(1, 64);
    mn->forward(*kv2, pre, out);
    ASSERT_EQ(ids.size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(ids[r], argmax(out.logits.data() + size_t(r) * V, V));
  }
}

// Greedy speculation == plain greedy, simulated without a drafter: verify blocks made of
// the plain-greedy continuation (all accepted) and of wrong guesses (rolled back with
// truncate) reproduce the plain greedy ids exactly.
TEST(CudaModel, VerifyBlocksWithRollbackReproducePlainGreedy) {
  SKIP_WITHOUT_GPU();
  auto m = load_qwen3_cuda(kQwen3Dir + "/bf16_weights");
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::vector<int32_t> plain = greedy(*m, prompt, 24);
  auto kv = m->make_kv_cache(1, 64);
  ForwardBatch b;
  b.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
  ForwardOutput out;
  std::vector<int32_t> ids, got;
  m->forward_argmax(*kv, b, out, ids);
  got.push_back(ids[0]);
  int round = 0;
  while (got.size() < plain.size()) {
    // Drafts: the true continuation for 3 tokens, then a wrong token (every other round).
    std::vector<int32_t> block = {got.back()};
    for (size_t k = got.size(); k < std::min(plain.size(), got.size() + 3); ++k) block.push_back(plain[k]);
    if (round++ % 2) block.push_back((block.back() + 1) % m->config().vocab_size);
    const int base = kv->length(0);
    b.entries[0] = {0, block, {}};
    for (size_t i = 0; i < block.size(); ++i) b.entries[0].logit_rows.push_back(static_cast<int>(i));
    m->forward_argmax(*kv, b, out, ids);
    size_t acc = 0;  // accept drafts while they equal the model's argmax
    while (acc + 1 < block.size() && block[acc + 1] == ids[acc]) ++acc;
    for (size_t i = 1; i <= acc; ++i) got.push_back(block[i]);
    got.push_back(ids[acc]);
    kv->truncate(0, base + static_cast<int>(acc) + 1);
  }
  got.resize(plain.size());
  EXPECT_EQ(got, plain);
}

// The embedded target on GPU vs CPU: prefill logits close (BF16 tolerance), and the number
// of greedy ids that agree before the first difference is printed for docs/PERFORMANCE.md.
TEST(CudaModel, EmbeddedTargetAgreesWithCpu) {
  SKIP_WITHOUT_GPU();
  if (!std::filesystem::exists(kEmbedded + "/config.json")) GTEST_SKIP() << "no " << kEmbedded;
  auto gpu = load_qwen3_cuda(kEmbedded);
  auto cpu = load_model(kEmbedded);
  const int V = cpu->config().vocab_size;
  const std::vector<int32_t> prompt = {100, 2000, 31, 4000, 77, 5, 600, 7000, 12, 13};
  ForwardBatch b;
  b.entries.push_back({0, prompt, {}});
  for (size_t i = 0; i < prompt.size(); ++i) b.entries[0].logit_rows.push_back(static_cast<int>(i));
  ForwardOutput og, oc;
  auto kg = gpu->make_kv_cache(1, 16);
  auto kc = cpu->make_kv_cache(1, 16);
  gpu->forward(*kg, b, og);
  cpu->forward(*kc, b, oc);
  ASSERT_EQ(og.logits.size(), oc.logits.size());
  for (size_t t = 0; t < prompt.size(); ++t) {
    double scale = 1, worst = 0;
    for (int j = 0; j < V; ++j) scale = std::max(scale, double(std::abs(oc.logits[t * V + j])));
    for (int j = 0; j < V; ++j) worst = std::max(worst, double(std::abs(og.logits[t * V + j] - oc.logits[t * V + j])));
    EXPECT_LE(worst, 4e-2 * scale) << "position " << t;
  }
  const int n = 64;
  const auto g = greedy(*gpu, prompt, n), c = greedy(*cpu, prompt, n);
  int k = 0;
  while (k < n && g[k] == c[k]) ++k;
  std::cout << "[cuda embedded] greedy ids agreeing with the CPU before the first difference: " << k << "/" << n << "\n";
}

// Tensor parallelism's GPU forward (load_qwen3_cuda_tensor_parallel): rank models on one
// GPU, each with its heads, KV heads and features, their o and down outputs summed through
// host memory. Greedy decoding equals the single GPU model's, logits to BF16 rounding: the
// embedded target over 2 ranks, a test model with biases
// (the o bias added once, after the reduction) over 2, and one whose 2 KV heads are
// replicated over 4 ranks.
TEST(CudaModel, TensorParallelRanksDecodeAsTheSingleModel) {
  SKIP_WITHOUT_GPU();
  struct Case {
    std::string dir;
    int ranks;
  };
  int ran = 0;
  for (const Case& c : {Case{kEmbedded, 2}, Case{kQwen3Dir + "/mha_bias_hd24", 2}, Case{kQwen3Dir + "/tied_gqa2", 4}}) {
    if (!std::filesystem::exists(c.dir + "/config.json")) continue;
    SCOPED_TRACE(c.dir + ", " + std::to_string(c.ranks) + " ranks");
    ++ran;
    auto single = load_qwen3_cuda(c.dir);
    auto split = load_qwen3_cuda_tensor_parallel(c.dir, c.ranks);
    const int V = single->config().vocab_size, steps = 24;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 10; ++i) prompt.push_back((i * 131 + 7) % V);
    auto decode = [&](Model& m, std::vector<float>& logits) {
      auto kv = m.make_kv_cache(1, static_cast<int>(prompt.size()) + steps + 1);
      ForwardBatch b;
      b.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
      ForwardOutput out;
      std::vector<int32_t> toks;
      for (int i = 0; i < steps; ++i) {
        m.forward(*kv, b, out);
        logits.insert(logits.end(), out.logits.begin(), out.logits.end());
        toks.push_back(argmax(out.logits.data(), V));
        b.entries[0] = {0, {toks.back()}, {0}};
      }
      return toks;
    };
    std::vector<float> la, lb;
    const std::vector<int32_t> a = decode(*single, la), b = decode(*split, lb);
    EXPECT_EQ(a, b);
    ASSERT_EQ(la.size(), lb.size());
    double worst = 0, scale = 1e-6;
    for (size_t i = 0; i < la.size(); ++i) {
      worst = std::max(worst, double(std::abs(la[i] - lb[i])));
      scale = std::max(scale, double(std::abs(la[i])));
    }
    // Not bit-equal: x's partial sums meet in another order, and a change in x's last bits
    // can move a BF16 rounding of the next GEMM's staged input (the CPU tolerance of
    // EmbeddedTargetAgreesWithCpu, for the same reason).
    EXPECT_LT(worst, 2e-2 * scale) << "the split's logits differ from the single model's beyond BF16 rounding";
    std::cout << "[cuda tensor parallel] " << c.dir << " over " << c.ranks << " ranks: worst |diff| / scale "
              << worst / scale << "\n";
  }
  EXPECT_GT(ran, 0) << "no model to split";
  EXPECT_THROW(load_qwen3_cuda_tensor_parallel(kQwen3Dir + "/tied_gqa2", 3), Error);  // 4 heads over 3 ranks
}

// The same split over NCCL (cuda_nccl.h), one GPU per rank: an all-gather and a sum in
// rank order, inside the CUDA graphs. With one rank it must give the single model's tokens
// (its logits to rounding: a zero's sign); with two, on a machine with two GPUs, what the
// host-memory form gives. Skipped without libnccl.so.2 or without enough GPUs.
TEST(CudaModel, TensorParallelOverNcclDecodesAsTheSingleModel) {
  SKIP_WITHOUT_GPU();
  if (!std::filesystem::exists(kEmbedded + "/config.json")) GTEST_SKIP() << "no " << kEmbedded;
  const std::string why = cuda::nccl_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  int gpus = 0;
  DSINFER_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  auto single = load_qwen3_cuda(kEmbedded);
  const int V = single->config().vocab_size;
  const std::vector<int32_t> prompt = {100, 2000, 31, 4000, 77, 5, 600, 7000, 12, 13};
  const std::vector<int32_t> want = greedy(*single, prompt, 32);
  for (int ranks : {1, 2}) {
    if (ranks > gpus) {
      std::cout << "[cuda tensor parallel] NCCL over " << ranks << " GPUs not run: " << gpus << " GPU(s) here\n";
      continue;
    }
    SCOPED_TRACE(std::to_string(ranks) + " ranks over NCCL");
    auto split = load_qwen3_cuda_tensor_parallel(kEmbedded, ranks, {}, TensorParallelTransport::Nccl);
    EXPECT_EQ(greedy(*split, prompt, 32), want);
    ForwardBatch b;
    b.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
    ForwardOutput oa, ob;
    auto ka = single->make_kv_cache(1, 16), kb = split->make_kv_cache(1, 16);
    single->forward(*ka, b, oa);
    split->forward(*kb, b, ob);
    ASSERT_EQ(oa.logits.size(), ob.logits.size());
    double worst = 0, scale = 1e-6;
    for (int j = 0; j < V; ++j) {
      worst = std::max(worst, double(std::abs(oa.logits[j] - ob.logits[j])));
      scale = std::max(scale, double(std::abs(oa.logits[j])));
    }
    EXPECT_LT(worst, (ranks == 1 ? 1e-6 : 2e-2) * scale);
  }
}

// A sequence decoded one token per forward over a dense or paged cache, with the drafter's
// layer captures (the embedding, layer 0, the last layer), logits and argmax ids taking
// turns, then a step without logits or captures (a one-token prefill chunk) and one more:
// what the decode-path tests compare bit for bit.
struct DecodeRun {
  std::vector<float> logits, captured;
  std::vector<int32_t> ids;
};
DecodeRun decode_with_captures(Model& m, bool paged) {
  const std::vector<int32_t>& seq = kDecodeSeq;
  const int prefix = kDecodePrefix;
  const int L = m.config().num_hidden_layers;
  std::unique_ptr<KVCache> kv = decode_cache(m, paged);
  DecodeRun r;
  ForwardOutput out;
  ForwardBatch pre;
  pre.entries.push_back({0, std::vector<int32_t>(seq.begin(), seq.begin() + prefix), {}});
  m.forward(*kv, pre, out);
  for (size_t i = prefix; i < seq.size(); ++i) {
    ForwardBatch d;
    d.entries.push_back({0, {seq[i]}, {0}});
    d.capture_layers = {-1, 0, L - 1};
    if (i % 2) {
      m.forward(*kv, d, out);
      r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
    } else {
      std::vector<int32_t> ids;
      m.forward_argmax(*kv, d, out, ids);
      r.ids.insert(r.ids.end(), ids.begin(), ids.end());
    }
    r.captured.insert(r.captured.end(), out.captured.begin(), out.captured.end());
  }
  ForwardBatch quiet;
  quiet.entries.push_back({0, {33}, {}});
  m.forward(*kv, quiet, out);
  ForwardBatch last;
  last.entries.push_back({0, {34}, {0}});
  m.forward(*kv, last, out);
  r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
  return r;
}

// The persistent decode kernel (cuda_persistent_decode.h) against the layered kernels: a
// sequence decoded one token per forward (graphs on, so replays count too) over a dense and
// a paged cache (scattered blocks of 3 positions), with the drafter's layer captures (the
// embedding, layer 0, the last layer): every logit row, captured row and argmax id is
// bit-identical, and the persistent path did run (its call counter). Every test model
// without biases, and the embedded target (head_dim 64, 8 layers).
TEST(CudaModel, PersistentDecodeEqualsLayeredKernels) {
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t>& seq = kDecodeSeq;
  const int prefix = kDecodePrefix;
  for (const std::string& dir : decode_test_dirs()) {
    SCOPED_TRACE(dir);
    // The persistent kernel repeats the row kernel's arithmetic: both models on the row kernel.
    CudaModelOptions rows;
    rows.tensor_core_gemm = false;
    auto [mp, ml] = load_with_and_without(dir, &CudaModelOptions::persistent_decode, rows);
    for (bool paged : {false, true}) {
      SCOPED_TRACE(paged ? "paged" : "dense");
      const int64_t before = cuda_persistent_decode_calls(*mp);
      const DecodeRun a = decode_with_captures(*mp, paged), b = decode_with_captures(*ml, paged);
      EXPECT_EQ(cuda_persistent_decode_calls(*mp) - before, static_cast<int64_t>(seq.size() - prefix) + 2);
      EXPECT_EQ(cuda_persistent_decode_calls(*ml), 0);
      ASSERT_EQ(a.logits.size(), b.logits.size());
      ASSERT_EQ(a.captured.size(), b.captured.size());
      EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4)) << "logit rows";
      EXPECT_EQ(0, std::memcmp(a.captured.data(), b.captured.data(), a.captured.size() * 4)) << "captured rows";
      EXPECT_EQ(a.ids, b.ids);
    }
  }
}

// The fused layer tail (cuda_layer_tail.h: o, gate/up, down and the next layer's QKV as one
// kernel with grid barriers) against the layered kernels, as the persistent test above: every
// logit row, captured row and argmax id bit-identical, dense and paged, for both staging
// widths and blocks of 4 or 16 warps, and the fused path did run. Every test model without
// biases, and the embedded target; graphs on, so replays count too.
TEST(CudaModel, FusedLayerTailEqualsLayeredKernels) {
  SKIP_WITHOUT_GPU();
  for (const std::string& dir : decode_test_dirs()) {
    SCOPED_TRACE(dir);
    CudaModelOptions rows;  // the fused tail repeats the row kernel's arithmetic
    rows.tensor_core_gemm = false;
    std::unique_ptr<Model> layered = load_qwen3_cuda(dir, rows);
    for (auto [unroll, warps] : {std::pair{1, 4}, std::pair{2, 4}, std::pair{1, 16}}) {
      SCOPED_TRACE("staging loads in flight " + std::to_string(unroll) + ", warps per block " + std::to_string(warps));
      CudaModelOptions opts = rows;
      opts.fused_layer_tail = unroll;
      opts.fused_layer_tail_warps = warps;
      std::unique_ptr<Model> fused = load_qwen3_cuda(dir, opts);
      for (bool paged : {false, true}) {
        SCOPED_TRACE(paged ? "paged" : "dense");
        const int64_t before = cuda_fused_tail_calls(*fused);
        const DecodeRun a = decode_with_captures(*fused, paged), b = decode_with_captures(*layered, paged);
        EXPECT_EQ(cuda_fused_tail_calls(*fused) - before, static_cast<int64_t>(kDecodeSeq.size() - kDecodePrefix) + 2);
        EXPECT_EQ(cuda_fused_tail_calls(*layered), 0);
        ASSERT_EQ(a.logits.size(), b.logits.size());
        ASSERT_EQ(a.captured.size(), b.captured.size());
        EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4)) << "logit rows";
        EXPECT_EQ(0, std::memcmp(a.captured.data(), b.captured.data(), a.captured.size() * 4)) << "captured rows";
        EXPECT_EQ(a.ids, b.ids);
      }
    }
  }
}

// One-row forwards fold the q/k step into attention's kernel (fold_qk_decode): the same
// logit bits as the separate q/k kernel, dense and paged, on every test shape (GQA 2-4,
// head_dim 32-128, YaRN), graphs on; a verify block after the one-row steps reads the K/V
// rows they wrote, so the cache contents are compared too.
TEST(CudaModel, FoldedQkDecodeEqualsSeparateKernels) {
  SKIP_WITHOUT_GPU();
  for (const std::string& dir : decode_test_dirs()) {
    SCOPED_TRACE(dir);
    auto [mf, ms] = load_with_and_without(dir, &CudaModelOptions::fold_qk_decode);
    for (bool paged : {false, true}) {
      SCOPED_TRACE(paged ? "paged" : "dense");
      const std::vector<float> a = decode_then_verify(*mf, paged), b = decode_then_verify(*ms, paged);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
    }
  }
}

// Programmatic dependent launch changes when a kernel may start, never what it computes:
// eager runs with no PDL, PDL on the GEMMs and PDL everywhere give the same bits (a kernel
// that read an earlier kernel's output before its pdl_wait would race and differ), and so
// do graph replays with the default sites.
TEST(CudaModel, PdlVariantsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  for (const std::string& dir : decode_test_dirs()) {
    SCOPED_TRACE(dir);
    auto [mg, mn] = load_with_and_without(dir, &CudaModelOptions::use_graphs);
    for (bool paged : {false, true}) {
      SCOPED_TRACE(paged ? "paged" : "dense");
      std::vector<float> ref;
      {
        cuda::PdlScope none(0);
        ref = decode_then_verify(*mn, paged);
      }
      for (unsigned sites : {static_cast<unsigned>(cuda::PdlSite::Gemv), cuda::kPdlAllSites}) {
        cuda::PdlScope scope(sites);
        const std::vector<float> got = decode_then_verify(*mn, paged);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4)) << "eager, PDL sites " << sites;
      }
      for (int pass = 0; pass < 2; ++pass) {  // the second pass replays the graphs captured in the first
        const std::vector<float> got = decode_then_verify(*mg, paged);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4)) << "graphs (" << cuda_pdl_summary() << "), pass " << pass;
      }
    }
  }
}

TEST(CudaModel, BadInputGivesErrors) {
  SKIP_WITHOUT_GPU();
  auto m = load_qwen3_cuda(kQwen3Dir + "/tied_gqa2");
  auto cpu = load_model(kQwen3Dir + "/tied_gqa2");
  auto cpu_kv = cpu->make_kv_cache(1, 8);
  ForwardBatch b;
  b.entries.push_back({0, {1, 2}, {1}});
  ForwardOutput out;
  EXPECT_THROW(m->forward(*cpu_kv, b, out), Error);  // not a device cache
  auto kv = m->make_kv_cache(1, 4);
  b.entries[0].tokens = {1, 2, 3, 4, 5};
  EXPECT_THROW(m->forward(*kv, b, out), Error);  // overflow
  EXPECT_EQ(kv->length(0), 0);
  b.entries[0].tokens = {1, 1 << 20};
  EXPECT_THROW(m->forward(*kv, b, out), Error);  // token id
  EXPECT_THROW(m->make_kv_cache(1 << 20, 1 << 20), Error);  // over the prealloc budget
  // max_tokens <= 0: sized from the prealloc ratio of free memory.
  CudaModelOptions small;
  small.cache_prealloc_ratio = 0.001;
  auto m2 = load_qwen3_cuda(kQwen3Dir + "/tied_gqa2", small);
  auto kv2 = m2->make_kv_cache(2, 0);
  EXPECT_GE(kv2->max_tokens(), 1);
}

#else
TEST(CudaModel, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without DSINFER_CUDA"; }
#endif
