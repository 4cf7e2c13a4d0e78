// Model floor: conformance with Hugging Face transformers on tiny random Qwen3 checkpoints.
//
// Each directory tests/data/qwen3/<case>/ holds a save_pretrained checkpoint plus
//   golden.json               {"prompts": [[ids]...], "greedy": [[32 ids]...]}
//   golden_logits.safetensors F32 "logits.<i>" [len(prompts[i]), vocab], every position
// produced by tools/reference/gen_qwen3_goldens.py (transformers, F32, eager attention).
//
// Tolerance definition used here: for every logits row, |ours - ref| <= 1e-4 * max(1,
// max |ref| over that row), element-wise. Greedy: prefill the prompt, then decode one token
// at a time through the KV cache taking argmax (lowest index on ties, as torch.argmax);
// the 32 generated ids must equal the golden ids exactly.
//
// The BF16 case stores BF16 weights; its reference computes in F32 with those rounded
// weights and F32 rotary frequencies (as transformers does when it loads a BF16 file).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"

using namespace dsinfer;

namespace {

std::vector<std::string> case_dirs() {
  std::vector<std::string> dirs;
  const std::filesystem::path root = std::filesystem::path(DSINFER_TEST_DATA) / "qwen3";
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return dirs;
  for (const auto& e : std::filesystem::directory_iterator(root))
    if (e.is_directory() && std::filesystem::exists(e.path() / "golden.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

TEST(ModelGolden, TransformersLogitsAndGreedy) {
  const auto dirs = case_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no golden cases under " << DSINFER_TEST_DATA << "/qwen3 (see tools/reference/gen_qwen3_goldens.py)";
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto model = load_model(dir);
    const int V = model->config().vocab_size;
    const auto golden = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
    SafetensorsFile ref(dir + "/golden_logits.safetensors");
    std::map<std::string, const SafetensorsTensor*> by_name;
    for (const auto& t : ref.header().tensors) by_name[t.name] = &t;
    const auto& prompts = golden.at("prompts");
    const auto& greedy = golden.at("greedy");
    ASSERT_EQ(prompts.size(), greedy.size());
    for (size_t p = 0; p < prompts.size(); ++p) {
      SCOPED_TRACE("prompt " + std::to_string(p));
      const std::vector<int32_t> toks = prompts[p].get<std::vector<int32_t>>();
      const int n = static_cast<int>(toks.size());
      const auto it = by_name.find("logits." + std::to_string(p));
      ASSERT_NE(it, by_name.end());
      const SafetensorsTensor& lt = *it->second;
      ASSERT_EQ(lt.dtype, DType::F32);
      ASSERT_EQ(lt.shape, (std::vector<int64_t>{n, V}));
      const uint8_t* ref_bytes = ref.tensor_data(lt);

      // Logits at every prompt position.
      auto kv = model->make_kv_cache(1, n + 40);
      ForwardBatch b;
      b.entries.push_back({0, toks, {}});
      for (int i = 0; i < n; ++i) b.entries[0].logit_rows.push_back(i);
      ForwardOutput out;
      model->forward(*kv, b, out);
      for (int t = 0; t < n; ++t) {
        double scale = 1.0, worst = 0.0;
        for (int j = 0; j < V; ++j) scale = std::max(scale, std::abs(double(load_as_f32(ref_bytes, DType::F32, int64_t(t) * V + j))));
        for (int j = 0; j < V; ++j)
          worst = std::max(worst, std::abs(double(out.logits[size_t(t) * V + j]) - load_as_f32(ref_bytes, DType::F32, int64_t(t) * V + j)));
        EXPECT_LE(worst, 1e-4 * scale) << "position " << t << ": worst |diff| " << worst << ", row scale " << scale;
      }

      // Greedy continuation: plain decode, one token per forward.
      std::vector<int32_t> gen;
      int next = argmax(out.logits.data() + size_t(n - 1) * V, V);
      const auto want = greedy[p].get<std::vector<int32_t>>();
      while (gen.size() < want.size()) {
        gen.push_back(next);
        if (gen.size() == want.size()) break;
        ForwardBatch d;
        d.entries.push_back({0, {next}, {0}});
        model->forward(*kv, d, out);
        next = argmax(out.logits.data(), V);
      }
      EXPECT_EQ(gen, want);
    }
  }
}
