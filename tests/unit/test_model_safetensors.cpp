// Model floor: safetensors parsing and model-directory validation. Every malformed input
// must give a dsinfer::Error whose message names the file and the tensor or field at fault
// (asserted on substrings), never a crash or a silently wrong model.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "model_test_util.h"

using namespace dsinfer;
using namespace dsinfer::test;

namespace {

// A raw safetensors image from a header text and a data region of `data_bytes` bytes.
std::string raw_file(const std::string& header, size_t data_bytes, uint64_t declared_len = UINT64_MAX) {
  uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

std::string parse_error(const std::string& bytes) {
  try {
    parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_HAS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << "message: " << (msg)

// Rewrites model.safetensors of `dir` with one tensor replaced (dtype/shape/data).
void rewrite_with(const std::string& dir, const WeightMap& w, const std::string& name, DType dt,
                  std::vector<int64_t> shape, const std::vector<std::string>& drop = {}) {
  SafetensorsFile f(dir + "/model.safetensors");
  std::vector<std::vector<uint8_t>> keep;
  std::vector<SafetensorsWriteItem> items;
  for (const auto& t : f.header().tensors) {
    if (std::find(drop.begin(), drop.end(), t.name) != drop.end()) continue;
    if (t.name == name) {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      keep.emplace_back(static_cast<size_t>(n) * dtype_size(dt), 0);
      items.push_back({t.name, dt, shape, nullptr, {}});
    } else {
      keep.emplace_back(f.tensor_data(t), f.tensor_data(t) + t.nbytes);
      items.push_back({t.name, t.dtype, t.shape, nullptr, {}});
    }
  }
  for (size_t i = 0; i < items.size(); ++i) items[i].data = keep[i].data();
  write_safetensors(dir + "/model.safetensors.tmp", items);
  std::filesystem::rename(dir + "/model.safetensors.tmp", dir + "/model.safetensors");
}

}  // namespace

TEST(Safetensors, RoundTripAndMetadata) {
  TempDir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f)};
  write_safetensors(dir.file("t.safetensors"),
                    {{"a", DType::F32, {2, 3}, a.data(), {}}, {"b", DType::BF16, {2}, b.data(), {}},
                     {"empty", DType::F32, {0, 4}, nullptr, [](uint8_t*) {}}},
                    {{"format", "pt"}});
  SafetensorsFile f(dir.file("t.safetensors"));
  EXPECT_EQ(f.header().metadata.at("format"), "pt");
  EXPECT_EQ(f.header().data_begin % 8, 0u);
  ASSERT_EQ(f.header().tensors.size(), 3u);
  std::map<std::string, const SafetensorsTensor*> m;
  for (const auto& t : f.header().tensors) m[t.name] = &t;
  EXPECT_EQ(m["a"]->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(0, std::memcmp(f.tensor_data(*m["a"]), a.data(), 24));
  EXPECT_EQ(load_as_f32(f.tensor_data(*m["b"]), DType::BF16, 1), -2.0f);
  EXPECT_EQ(m["empty"]->nbytes, 0u);
}

TEST(Safetensors, MalformedHeadersNameFileAndTensor) {
  EXPECT_HAS(parse_error("abc"), "x.safetensors: truncated");
  EXPECT_HAS(parse_error(raw_file("{}", 0, 1000)), "header length 1000 goes beyond the end of the file");
  EXPECT_HAS(parse_error(raw_file("{\"a\": {\"dtype\": \"F32\", ", 0)), "invalid JSON header");
  EXPECT_HAS(parse_error(raw_file("[1, 2]", 0)), "not a JSON object");
  const std::string ok_a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  EXPECT_EQ(parse_error(raw_file("{" + ok_a + "}", 8)), "<no error>");
  // Data region shorter than the offsets claim (a truncated file).
  EXPECT_HAS(parse_error(raw_file("{" + ok_a + "}", 7)), "tensor 'a': data_offsets [0, 8] outside the data region (7 bytes)");
  EXPECT_HAS(parse_error(raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8)),
             "tensor 'w': data_offsets [8, 0] has begin > end");
  EXPECT_HAS(parse_error(raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)),
             "tensor 'w': data_offsets span 8 bytes but shape [3] of F32 needs 12");
  EXPECT_HAS(parse_error(raw_file(R"({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}})", 8)),
             "tensor 'w': unsupported dtype 'Q9'");
  EXPECT_HAS(parse_error(raw_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8)),
             "tensor 'w': shape entries must be non-negative");
  EXPECT_HAS(parse_error(raw_file(
                 R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 8]}})", 8)),
             "tensor 'w': shape");
  EXPECT_HAS(parse_error(raw_file(R"({"w": {"dtype": "F32", "shape": [2]}})", 8)), "tensor 'w': 'data_offsets'");
  EXPECT_HAS(parse_error(raw_file("{" + ok_a + ", " + ok_a + "}", 8)), "tensor 'a': appears twice");
  EXPECT_HAS(parse_error(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                  12)),
             "tensor 'b': data overlaps tensor 'a'");
  EXPECT_HAS(parse_error(raw_file(R"({"__metadata__": {"k": 3}})", 0)), "'__metadata__' entry 'k' must be a string");
}

class ModelDirErrors : public ::testing::Test {
 protected:
  void SetUp() override { w = write_tiny_model(dir.path, spec); }
  TempDir dir;
  TinySpec spec;
  WeightMap w;
};

TEST_F(ModelDirErrors, ValidDirectoryLoads) { EXPECT_EQ(load_error(dir.path), "<no error>"); }

TEST_F(ModelDirErrors, WrongDtype) {
  rewrite_with(dir.path, w, "model.layers.0.self_attn.k_proj.weight", DType::I32, {16, 32});
  std::string e = load_error(dir.path);
  EXPECT_HAS(e, "model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': dtype I32 not one of F32, BF16, F16");
}

TEST_F(ModelDirErrors, WrongShapeVersusConfig) {
  rewrite_with(dir.path, w, "model.layers.1.mlp.down_proj.weight", DType::F32, {32, 40});
  EXPECT_HAS(load_error(dir.path), "tensor 'model.layers.1.mlp.down_proj.weight': shape [32, 40] but the config implies [32, 48]");
}

TEST_F(ModelDirErrors, MissingTensor) {
  rewrite_with(dir.path, w, "", DType::F32, {}, {"model.layers.1.mlp.up_proj.weight"});
  EXPECT_HAS(load_error(dir.path), "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' not found");
}

TEST_F(ModelDirErrors, UntiedWithoutLmHead) {
  rewrite_with(dir.path, w, "", DType::F32, {}, {"lm_head.weight"});
  EXPECT_HAS(load_error(dir.path), "tensor 'lm_head.weight' not found and config.json field 'tie_word_embeddings' is false");
}

TEST_F(ModelDirErrors, TruncatedWeightsFile) {
  std::filesystem::resize_file(dir.file("model.safetensors"), std::filesystem::file_size(dir.file("model.safetensors")) - 10);
  std::string e = load_error(dir.path);
  EXPECT_HAS(e, "model.safetensors: tensor 'lm_head.weight': data_offsets");
  EXPECT_HAS(e, "outside the data region");
}

TEST_F(ModelDirErrors, MissingConfigField) {
  auto c = tiny_config_json(spec);
  c.erase("hidden_size");
  write_text(dir.file("config.json"), c.dump());
  EXPECT_HAS(load_error(dir.path), "config.json: field 'hidden_size': missing");
}

TEST_F(ModelDirErrors, UnknownArchitecture) {
  auto c = tiny_config_json(spec);
  c["architectures"] = {"MambaForCausalLM"};
  write_text(dir.file("config.json"), c.dump());
  EXPECT_HAS(load_error(dir.path), "config.json: field 'architectures': unsupported architecture 'MambaForCausalLM'");
}

TEST_F(ModelDirErrors, UnsupportedActivation) {
  auto c = tiny_config_json(spec);
  c["hidden_act"] = "gelu";
  write_text(dir.file("config.json"), c.dump());
  EXPECT_HAS(load_error(dir.path), "field 'hidden_act'");
}

TEST_F(ModelDirErrors, NoWeightsAtAll) {
  std::filesystem::remove(dir.file("model.safetensors"));
  EXPECT_HAS(load_error(dir.path), "no model.safetensors or model.safetensors.index.json");
}

TEST_F(ModelDirErrors, ShardedModelLoadsAndMatchesSingleFile) {
  // Split into two shards plus an index, then compare logits with the single-file model.
  TempDir sharded;
  std::filesystem::copy_file(dir.file("config.json"), sharded.file("config.json"));
  SafetensorsFile f(dir.file("model.safetensors"));
  std::vector<SafetensorsWriteItem> s1, s2;
  nlohmann::json wm;
  int i = 0;
  for (const auto& t : f.header().tensors) {
    auto& dst = (i++ % 2) ? s2 : s1;
    dst.push_back({t.name, t.dtype, t.shape, f.tensor_data(t), {}});
    wm[t.name] = (&dst == &s1) ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(sharded.file("model-00001-of-00002.safetensors"), s1);
  write_safetensors(sharded.file("model-00002-of-00002.safetensors"), s2);
  write_text(sharded.file("model.safetensors.index.json"), nlohmann::json{{"metadata", {}}, {"weight_map", wm}}.dump());
  auto a = load_model(dir.path), b = load_model(sharded.path);
  auto run = [](Model& m) {
    auto kv = m.make_kv_cache(1, 8);
    ForwardBatch batch;
    batch.entries.push_back({0, {3, 1, 4, 1, 5}, {4}});
    ForwardOutput out;
    m.forward(*kv, batch, out);
    return out.logits;
  };
  EXPECT_EQ(run(*a), run(*b));

  // Index naming a shard that does not exist.
  wm["model.norm.weight"] = "model-00003-of-00002.safetensors";
  write_text(sharded.file("model.safetensors.index.json"), nlohmann::json{{"weight_map", wm}}.dump());
  EXPECT_HAS(load_error(sharded.path), "model.safetensors.index.json: shard 'model-00003-of-00002.safetensors' not found");
  // Index naming a tensor its shard lacks.
  wm["model.norm.weight"] = "model-00001-of-00002.safetensors";
  wm["model.extra.weight"] = "model-00002-of-00002.safetensors";
  write_text(sharded.file("model.safetensors.index.json"), nlohmann::json{{"weight_map", wm}}.dump());
  std::string e = load_error(sharded.path);
  EXPECT_TRUE(e.find("tensor 'model.norm.weight': listed in shard") != std::string::npos ||
              e.find("tensor 'model.extra.weight': listed in shard") != std::string::npos)
      << e;
  // Path traversal in a shard name.
  wm.erase("model.extra.weight");
  wm["model.norm.weight"] = "../x.safetensors";
  write_text(sharded.file("model.safetensors.index.json"), nlohmann::json{{"weight_map", wm}}.dump());
  EXPECT_HAS(load_error(sharded.path), "invalid shard file name '../x.safetensors'");
}

TEST_F(ModelDirErrors, WeightDtypeOptionConverts) {
  LoadOptions o;
  o.weight_dtype = "bf16";
  EXPECT_NO_THROW(load_model(dir.path, o));
  o.weight_dtype = "int4";
  try {
    load_model(dir.path, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "weight dtype option 'int4'");
  }
}

TEST(RandomModel, WritesLoadableShardedCheckpoint) {
  // make-random-model's writer: a tiny preset split into many shards must load and run.
  TempDir dir;
  ModelConfig c = random_model_preset("tiny");
  write_random_model(c, DType::BF16, dir.path, 7, /*shard_bytes=*/64 << 10);
  EXPECT_TRUE(std::filesystem::exists(dir.file("model.safetensors.index.json")));
  auto m = load_model(dir.path);
  EXPECT_EQ(m->config().num_hidden_layers, c.num_hidden_layers);
  auto kv = m->make_kv_cache(1, 8);
  ForwardBatch b;
  b.entries.push_back({0, {1, 2, 3}, {2}});
  ForwardOutput out;
  m->forward(*kv, b, out);
  ASSERT_EQ(out.logits.size(), size_t(c.vocab_size));
  for (float x : out.logits) ASSERT_TRUE(std::isfinite(x));
  try {
    random_model_preset("qwen9");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "--like 'qwen9'");
  }
}
