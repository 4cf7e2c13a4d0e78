// Test helper: a tiny random DeepSeek-V4 target with a tiny DSpark drafter in the real
// checkpoint layout (mtp.{0,1,2}.*, original DeepSeek names, as vLLM/SGLang/llama.cpp load
// it), written at test time into a temporary directory.
//
// Data flow: the committed tiny V4 target tests/data/deepseek_v4/<base>/ (whose forward is
// checked against transformers goldens) is copied tensor by tensor; random mtp.* stages are
// added (full V4 blocks: mHC sites, attn_norm/ffn_norm, sliding attention without compressor
// or indexer, learned-routing MoE with a shared expert; mtp.0 main_proj/main_norm; last stage
// norm, hc_head, Markov head, confidence head) and config.json gains the dspark_* fields.
// `bigram` (optional) sets the Markov head so that it adds `bigram_gain` to the logit of
// bigram[prev] after prev: the tests use the target's own greedy transitions to make the
// random drafter propose drafts that are often right (acceptances AND rejections happen).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/safetensors.h"

namespace dsinfer::test {

// A fresh temporary directory, removed with everything in it at the end of the scope.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsinfer_v4test_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

struct TinyDSparkSpec {
  std::string base = "mixed4_f32";     // tests/data/deepseek_v4/<base>
  int stages = 3;
  int block_size = 5;
  int32_t noise_token = 2;
  std::vector<int> target_layer_ids;  // empty: the last three target layers
  int markov_rank = 24;
  bool confidence = true;
  std::map<int32_t, int32_t> bigram;  // prev → next (Markov bias), empty: random head
  float bigram_gain = 40.0f;
  uint32_t seed = 7;
  // Tensor surgery for loader tests: drop this stored name, or give it shape `reshape`.
  std::string drop, reshape_name;
  std::vector<int64_t> reshape;
  // > the base's vocab_size: the vocabulary grows to this many ids (random embedding rows,
  // zero LM head rows, hash-routing rows of expert ids), so that a small real tokenizer fits
  // the model (serve tests). The base's ids keep their rows.
  int64_t pad_vocab = 0;
};

inline void write_tiny_v4_dspark(const TinyDSparkSpec& sp, const std::string& out_dir) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(DSINFER_TEST_DATA) / "deepseek_v4" / sp.base;
  nlohmann::json cfg = nlohmann::json::parse(read_text_file((src / "config.json").string()));
  const int64_t D = cfg["hidden_size"], V0 = cfg["vocab_size"], H = cfg["num_attention_heads"], d = cfg["head_dim"];
  const int64_t qr = cfg["q_lora_rank"], G = cfg["o_groups"], orank = cfg["o_lora_rank"];
  const int64_t E = cfg["n_routed_experts"], I = cfg["moe_intermediate_size"];
  const int64_t nhc = cfg.value("hc_mult", 4), M = (2 + nhc) * nhc, L = cfg["num_hidden_layers"];
  const int64_t R = sp.markov_rank;
  std::vector<int> ids = sp.target_layer_ids;
  if (ids.empty())
    for (int64_t l = std::max<int64_t>(0, L - 3); l < L; ++l) ids.push_back(static_cast<int>(l));
  cfg["dspark_block_size"] = sp.block_size;
  cfg["dspark_noise_token_id"] = sp.noise_token;
  cfg["dspark_target_layer_ids"] = ids;
  cfg["dspark_markov_rank"] = sp.markov_rank;

  auto set = SafetensorsSet::open_dir(src.string());
  std::vector<SafetensorsWriteItem> items;
  std::deque<std::vector<float>> keep;
  std::deque<std::vector<int64_t>> keep_ids;
  std::mt19937 rng(sp.seed);
  const int64_t Vp = sp.pad_vocab > V0 ? sp.pad_vocab : V0;
  for (const auto& [name, loc] : set->tensors()) {
    const void* data = loc.file->tensor_data(*loc.tensor);
    std::vector<int64_t> shape = loc.tensor->shape;
    if (Vp > V0 && shape.size() == 2 && shape[0] == V0 &&
        (name.find("embed") != std::string::npos || name.find("head.weight") != std::string::npos ||
         name.find("tid2eid") != std::string::npos)) {
      const int64_t cols = shape[1];
      shape[0] = Vp;
      if (loc.tensor->dtype == DType::F32) {
        keep.emplace_back(static_cast<size_t>(Vp * cols));
        std::memcpy(keep.back().data(), data, static_cast<size_t>(V0 * cols) * sizeof(float));
        // Embedding rows random; LM head rows zero, so a padded id's logit is 0 and the
        // greedy argmax stays among the base ids (their largest logit is positive).
        const bool head = name.find("head.weight") != std::string::npos;
        std::normal_distribution<double> nd(0.0, 1.0);
        for (int64_t i = V0 * cols; i < Vp * cols; ++i)
          keep.back()[static_cast<size_t>(i)] = head ? 0.0f : static_cast<float>(nd(rng));
        data = keep.back().data();
      } else if (loc.tensor->dtype == DType::I64) {
        keep_ids.emplace_back(static_cast<size_t>(Vp * cols));
        std::memcpy(keep_ids.back().data(), data, static_cast<size_t>(V0 * cols) * sizeof(int64_t));
        for (int64_t i = V0 * cols; i < Vp * cols; ++i) keep_ids.back()[static_cast<size_t>(i)] = (i / cols + i % cols) % E;
        data = keep_ids.back().data();
      } else {
        throw std::runtime_error("pad_vocab: " + name + " is neither F32 nor I64");
      }
    }
    items.push_back({name, loc.tensor->dtype, shape, data, {}});
  }
  if (Vp > V0) cfg["vocab_size"] = Vp;
  const int64_t V = Vp;  // the drafter's heads cover the padded vocabulary

  auto add = [&](const std::string& name, std::vector<int64_t> shape, const std::function<float(int64_t)>& gen) {
    if (name == sp.drop) return;
    if (name == sp.reshape_name) shape = sp.reshape;
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    keep.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keep.back()[i] = gen(i);
    items.push_back({name, DType::F32, shape, keep.back().data(), {}});
  };
  auto normal = [&](double std) {
    return [&rng, std](int64_t) { return static_cast<float>(std::normal_distribution<double>(0.0, std)(rng)); };
  };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    add(name, {rows, cols}, normal(1.0 / std::sqrt(static_cast<double>(cols))));
  };
  auto norm = [&](const std::string& name, int64_t n) {
    add(name, {n}, [&rng](int64_t) { return 1.0f + static_cast<float>(std::normal_distribution<double>(0.0, 0.1)(rng)); });
  };
  for (int s = 0; s < sp.stages; ++s) {
    const std::string p = "mtp." + std::to_string(s) + ".";
    for (const char* site : {"hc_attn_", "hc_ffn_"}) {
      add(p + site + "fn", {M, nhc * D}, normal(0.1 / std::sqrt(static_cast<double>(nhc * D))));
      add(p + site + "base", {M}, normal(0.1));
      add(p + site + "scale", {3}, [](int64_t i) { return 0.5f + 0.25f * static_cast<float>(i); });
    }
    norm(p + "attn_norm.weight", D);
    norm(p + "ffn_norm.weight", D);
    mat(p + "attn.wq_a.weight", qr, D);
    norm(p + "attn.q_norm.weight", qr);
    mat(p + "attn.wq_b.weight", H * d, qr);
    mat(p + "attn.wkv.weight", d, D);
    norm(p + "attn.kv_norm.weight", d);
    mat(p + "attn.wo_a.weight", G * orank, H * d / G);
    mat(p + "attn.wo_b.weight", D, G * orank);
    add(p + "attn.attn_sink", {H}, normal(0.5));
    mat(p + "ffn.gate.weight", E, D);
    add(p + "ffn.gate.bias", {E}, normal(0.1));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      mat(ep + "w1.weight", I, D);
      mat(ep + "w3.weight", I, D);
      mat(ep + "w2.weight", D, I);
    }
    mat(p + "ffn.shared_experts.w1.weight", I, D);
    mat(p + "ffn.shared_experts.w3.weight", I, D);
    mat(p + "ffn.shared_experts.w2.weight", D, I);
    if (s == 0) {
      mat(p + "main_proj.weight", D, static_cast<int64_t>(ids.size()) * D);
      norm(p + "main_norm.weight", D);
    }
    if (s == sp.stages - 1) {
      norm(p + "norm.weight", D);
      add(p + "hc_head_fn", {nhc, nhc * D}, normal(0.1 / std::sqrt(static_cast<double>(nhc * D))));
      add(p + "hc_head_base", {nhc}, normal(0.1));
      add(p + "hc_head_scale", {1}, [](int64_t) { return 0.5f; });
      if (R > 0) {
        if (sp.bigram.empty()) {
          add(p + "markov_head.markov_w1.weight", {V, R}, normal(1.0));
          add(p + "markov_head.markov_w2.weight", {V, R}, normal(1.0 / std::sqrt(static_cast<double>(R))));
        } else {
          // W1[prev] = one-hot(slot of prev); W2[next][slot] = gain.
          std::vector<float> w1(static_cast<size_t>(V * R), 0.0f), w2(static_cast<size_t>(V * R), 0.0f);
          int slot = 0;
          for (const auto& [prev, next] : sp.bigram) {
            if (slot >= R) break;
            w1[static_cast<size_t>(prev * R + slot)] = 1.0f;
            w2[static_cast<size_t>(next * R + slot)] = sp.bigram_gain;
            ++slot;
          }
          add(p + "markov_head.markov_w1.weight", {V, R}, [w1](int64_t i) { return w1[static_cast<size_t>(i)]; });
          add(p + "markov_head.markov_w2.weight", {V, R}, [w2](int64_t i) { return w2[static_cast<size_t>(i)]; });
        }
      }
      if (sp.confidence) add(p + "confidence_head.proj.weight", {1, D + R}, normal(0.1));
    }
  }
  fs::create_directories(out_dir);
  write_safetensors(out_dir + "/model.safetensors", items);
  std::ofstream(out_dir + "/config.json") << cfg.dump(1);
}

}  // namespace dsinfer::test
