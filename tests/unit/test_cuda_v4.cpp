// CUDA backend: the DeepSeek-V4 model on the GPU (backend/cuda/deepseek_v4_cuda.cpp).
// Conformance with the transformers goldens (tests/data/deepseek_v4, F32, within 1e-4
// relative, as the CPU model) for full-prompt prefill, token-by-token decoding and ragged
// chunked prefill, the greedy continuation; agreement with the CPU model on a checkpoint
// with FP8 and FP4 weights (the quantized GEMV and the routed-expert kernel); rollback after
// rejected drafts equal to a fresh prefill bit for bit; batch invariance (two sequences in
// one forward, graphs or not); the batched engine over the GPU target (plain, preempting, with
// the DSpark drafter) equal to single-request greedy; errors for bad input. Skipped without
// DSINFER_CUDA or a GPU.
#include <gtest/gtest.h>

#ifdef DSINFER_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "core/error.h"
#include "deepseek_v4_golden_util.h"
#include "engine/generator.h"
#include "engine/llm_engine.h"
#include "engine/speculative.h"
#include "spec/drafter_loader.h"
#include "v4_dspark_test_util.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "model/safetensors.h"

using namespace dsinfer;

namespace {

const std::filesystem::path& kRoot = test::v4_golden_root();
using Golden = test::V4Golden;
using test::run_chunks;
using test::worst_rel;
std::vector<std::string> case_dirs() { return test::v4_case_dirs(); }
Golden read_golden(const std::string& dir) { return test::read_v4_golden(dir); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(CudaV4, TransformersGoldensPrefillDecodeChunkedAndGreedy) {
  SKIP_WITHOUT_GPU();
  const auto dirs = case_dirs();
  ASSERT_GE(dirs.size(), 5u);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto model = load_deepseek_v4_cuda(dir);
    const int V = model->config().vocab_size;
    const Golden g = read_golden(dir);
    const int S = static_cast<int>(g.prompt.size());
    int at = 0;
    auto kv = model->make_kv_cache(1, S + 16);
    const auto pre = run_chunks(*model, *kv, 0, g.prompt, {S});
    double w = worst_rel(pre.data(), g.logits.at("logits.prefill").data(), S, V, &at);
    EXPECT_LE(w, 1e-4) << "prefill: worst relative diff at row " << at;
    std::printf("%s prefill: worst relative diff %.3g\n", dir.c_str(), w);
    auto kv2 = model->make_kv_cache(1, S + 16);
    const auto dec = run_chunks(*model, *kv2, 0, g.prompt, std::vector<int>(S, 1));
    w = worst_rel(dec.data(), g.logits.at("logits.decode").data(), S, V, &at);
    EXPECT_LE(w, 1e-4) << "decode: worst relative diff at row " << at;
    std::printf("%s decode: worst relative diff %.3g\n", dir.c_str(), w);
    auto kv3 = model->make_kv_cache(1, S + 16);
    const auto chk = run_chunks(*model, *kv3, 0, g.prompt, g.chunks);
    w = worst_rel(chk.data(), g.logits.at("logits.chunked").data(), S, V, &at);
    EXPECT_LE(w, 1e-4) << "chunked: worst relative diff at row " << at;

    // Greedy continuation through forward_argmax (ids only leave the device).
    auto kv4 = model->make_kv_cache(1, S + static_cast<int>(g.greedy.size()) + 2);
    ForwardBatch b;
    b.entries.push_back({0, g.prompt, {S - 1}});
    ForwardOutput out;
    std::vector<int32_t> ids, gen;
    for (size_t i = 0; i < g.greedy.size(); ++i) {
      model->forward_argmax(*kv4, b, out, ids);
      ASSERT_EQ(ids.size(), 1u);
      gen.push_back(ids[0]);
      b.entries[0] = {0, {ids[0]}, {0}};
    }
    EXPECT_EQ(gen, g.greedy);
  }
}

// Verify [anchor, 5 drafts] with `acc` right, truncate to the committed length, continue:
// the continuation's logits equal those after a fresh prefill of the same tokens, bit for
// bit, at cut points across window / CSA / HCA boundaries.
TEST(CudaV4, RollbackAfterRejectedDraftsEqualsFreshPrefill) {
  SKIP_WITHOUT_GPU();
  for (const std::string& dir : case_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_deepseek_v4_cuda(dir);
    const int V = model->config().vocab_size;
    const Golden g = read_golden(dir);
    const int S = static_cast<int>(g.prompt.size());
    for (int n0 : {S / 3, S / 2 + 1, S - 8}) {
      for (int acc : {0, 2, 4}) {
        auto kv = model->make_kv_cache(2, S + 16);
        run_chunks(*model, *kv, 1, std::vector<int32_t>(g.prompt.begin(), g.prompt.begin() + n0), {n0});
        std::vector<int32_t> verify(g.prompt.begin() + n0, g.prompt.begin() + n0 + 1 + acc);
        while (verify.size() < 6) verify.push_back(static_cast<int32_t>((verify.size() * 7919 + n0) % V));
        run_chunks(*model, *kv, 1, verify, {6});
        const int c0 = n0 + 1 + acc;
        kv->truncate(1, c0);
        const std::vector<int32_t> cont(g.prompt.begin() + c0, g.prompt.begin() + std::min(S, c0 + 5));
        const auto a = run_chunks(*model, *kv, 1, cont, {static_cast<int>(cont.size())});
        auto kv2 = model->make_kv_cache(1, S + 16);
        run_chunks(*model, *kv2, 0, std::vector<int32_t>(g.prompt.begin(), g.prompt.begin() + c0), {c0});
        const auto b = run_chunks(*model, *kv2, 0, cont, {static_cast<int>(cont.size())});
        EXPECT_TRUE(same_bits(a, b)) << "n0 " << n0 << " acc " << acc;
      }
    }
  }
}

// Two sequences in one forward give each the bits it gets alone; replayed graphs (the third
// call of a shape) give the eager bits.
TEST(CudaV4, BatchInvariantAndGraphReplayIsExact) {
  SKIP_WITHOUT_GPU();
  const std::string dir = (kRoot / "flash_schedule").string();
  CudaModelOptions no_graphs;
  no_graphs.use_graphs = false;
  auto mg = load_deepseek_v4_cuda(dir);
  auto mn = load_deepseek_v4_cuda(dir, no_graphs);
  const Golden g = read_golden(dir);
  const int S = static_cast<int>(g.prompt.size());
  const int n1 = S - 12, n2 = S / 2;
  const std::vector<int32_t> p1(g.prompt.begin(), g.prompt.begin() + n1), p2(g.prompt.rbegin(), g.prompt.rbegin() + n2);
  // Alone, no graphs: prefill then 10 decode steps of 1 row.
  auto alone = [&](Model& m, const std::vector<int32_t>& p, std::vector<std::vector<float>>& steps) {
    auto kv = m.make_kv_cache(1, S + 16);
    run_chunks(m, *kv, 0, p, {static_cast<int>(p.size())});
    for (int i = 0; i < 10; ++i) steps.push_back(run_chunks(m, *kv, 0, {g.prompt[(i * 13) % S]}, {1}));
  };
  std::vector<std::vector<float>> a1, a2, ag;
  alone(*mn, p1, a1);
  alone(*mn, p2, a2);
  alone(*mg, p1, ag);  // graphs captured from the second decode step on
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(same_bits(ag[i], a1[i])) << "graph replay, step " << i;
  // Together: both sequences in every forward.
  auto kv = mg->make_kv_cache(2, S + 16);
  ForwardBatch b;
  b.entries.push_back({0, p1, {n1 - 1}});
  b.entries.push_back({1, p2, {n2 - 1}});
  ForwardOutput out;
  mg->forward(*kv, b, out);
  for (int i = 0; i < 10; ++i) {
    const int32_t t = g.prompt[(i * 13) % S];
    b.entries[0] = {0, {t}, {0}};
    b.entries[1] = {1, {t}, {0}};
    mg->forward(*kv, b, out);
    const int V = out.vocab_size;
    ASSERT_EQ(out.logits.size(), 2u * V);
    EXPECT_TRUE(same_bits(std::vector<float>(out.logits.begin(), out.logits.begin() + V), a1[i])) << "step " << i;
    EXPECT_TRUE(same_bits(std::vector<float>(out.logits.begin() + V, out.logits.end()), a2[i])) << "step " << i;
  }
}

// A checkpoint with FP8 attention / shared-expert matrices and per-expert FP4 gate/up and
// FP8 down experts (the quantized kernels, routed by expert on the device) agrees with the
// CPU model on the same checkpoint; the greedy continuation is the same.
TEST(CudaV4, QuantizedCheckpointAgreesWithCpu) {
  SKIP_WITHOUT_GPU();
  const std::filesystem::path src = kRoot / "mixed4_f32";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dsinfer_cuda_v4q_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  SafetensorsFile f((src / "model.safetensors").string());
  std::mt19937 rng(7);
  std::deque<std::vector<uint8_t>> keep;
  std::vector<SafetensorsWriteItem> items;
  auto add = [&](const std::string& name, DType dt, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    keep.push_back(std::move(bytes));
    items.push_back({name, dt, std::move(shape), keep.back().data(), nullptr});
  };
  auto codes = [&](size_t n, bool fp8) {
    std::vector<uint8_t> c(n);
    for (auto& b : c) {
      b = static_cast<uint8_t>(rng());
      if (fp8 && (b & 0x7f) == 0x7f) b -= 1;  // no NaN codes
    }
    return c;
  };
  auto scales = [&](size_t n, int e) {
    std::vector<uint8_t> s(n);
    for (auto& b : s) b = static_cast<uint8_t>(e + static_cast<int>(rng() % 3));
    return s;
  };
  auto ends_with = [](const std::string& n, const char* k) {
    return n.size() >= std::strlen(k) && n.compare(n.size() - std::strlen(k), std::strlen(k), k) == 0;
  };
  int n_fp8 = 0, n_fp4 = 0;
  for (const auto& t : f.header().tensors) {
    const uint8_t* data = f.tensor_data(t);
    const bool gu = t.name.find("mlp.experts.gate_up_proj") != std::string::npos;
    const bool dn = t.name.find("mlp.experts.down_proj") != std::string::npos;
    if (gu || dn) {
      const std::string base = t.name.substr(0, t.name.find(gu ? "gate_up_proj" : "down_proj"));
      for (int64_t e = 0; e < t.shape[0]; ++e) {
        const std::string ep = base + std::to_string(e) + ".";
        if (gu) {
          const int64_t I = t.shape[1] / 2, D = t.shape[2];
          for (const char* w : {"w1", "w3"}) {
            add(ep + w + ".weight", DType::U8, {I, D / 2}, codes(size_t(I * D / 2), false));
            add(ep + w + ".weight_scale_inv", DType::U8, {I, D / 32}, scales(size_t(I * D / 32), 124));
            ++n_fp4;
          }
        } else {
          const int64_t D = t.shape[1], I = t.shape[2];
          add(ep + "w2.weight", DType::U8, {D, I}, codes(size_t(D * I), true));
          add(ep + "w2.weight_scale_inv", DType::U8, {(D + 127) / 128, (I + 127) / 128},
              scales(size_t((D + 127) / 128 * ((I + 127) / 128)), 118));
          ++n_fp8;
        }
      }
      continue;
    }
    bool fp8 = false;
    // (The matrices whose inputs are a multiple of 16 wide, as the GPU kernel needs; real
    // checkpoints use multiples of 128.)
    for (const char* k : {"q_a_proj.weight", "self_attn.kv_proj.weight", "shared_experts.gate_proj.weight",
                          "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"})
      fp8 = fp8 || ends_with(t.name, k);
    if (fp8) {
      const int64_t R = t.shape[0], C = t.shape[1];
      add(t.name, DType::U8, t.shape, codes(size_t(R * C), true));
      add(t.name + "_scale_inv", DType::U8, {(R + 127) / 128, (C + 127) / 128},
          scales(size_t((R + 127) / 128 * ((C + 127) / 128)), 118));
      ++n_fp8;
      continue;
    }
    add(t.name, t.dtype, t.shape, std::vector<uint8_t>(data, data + t.nbytes));
  }
  ASSERT_GT(n_fp8, 20);
  ASSERT_GT(n_fp4, 20);
  write_safetensors((dir / "model.safetensors").string(), items);
  std::filesystem::copy_file(src / "config.json", dir / "config.json", std::filesystem::copy_options::overwrite_existing);

  auto cpu = load_model(dir.string());
  auto gpu = load_deepseek_v4_cuda(dir.string());
  const int V = cpu->config().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(3 + (i * 37) % (V - 3));
  auto kc = cpu->make_kv_cache(1, 64), kg = gpu->make_kv_cache(1, 64);
  const auto lc = run_chunks(*cpu, *kc, 0, ids, {24, 1, 1, 14});
  const auto lg = run_chunks(*gpu, *kg, 0, ids, {24, 1, 1, 14});
  ASSERT_EQ(lc.size(), lg.size());
  for (float v : lg) ASSERT_TRUE(std::isfinite(v));
  const double w = worst_rel(lg.data(), lc.data(), 40, V);
  EXPECT_LE(w, 1e-4) << "quantized checkpoint: CUDA against CPU";
  std::printf("quantized checkpoint: worst relative diff CUDA vs CPU %.3g\n", w);
  for (int r = 0; r < 40; ++r) EXPECT_EQ(argmax(lg.data() + size_t(r) * V, V), argmax(lc.data() + size_t(r) * V, V));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The checkpoint's own DSpark drafter (mtp.* stages, on the CPU) drafting for the GPU
// target: greedy speculation gives the GPU target's plain greedy ids, with drafts accepted
// and rejected along the way.
TEST(CudaV4, DSparkDrafterOnTheGpuTargetEqualsPlainGreedy) {
  SKIP_WITHOUT_GPU();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dsinfer_cuda_v4ds_" + std::to_string(::getpid()));
  test::TinyDSparkSpec sp;
  test::write_tiny_v4_dspark(sp, dir.string());
  auto target = load_deepseek_v4_cuda(dir.string());
  auto d = load_drafter(dir.string(), *target);
  const int V = target->config().vocab_size;
  std::mt19937 rng(11);
  int64_t drafted = 0, accepted = 0;
  for (int len : {1, 9, 30}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = static_cast<int32_t>(3 + rng() % static_cast<unsigned>(V - 3));
    StopConditions stop;
    stop.max_tokens = 40;
    const auto plain = generate(*target, nullptr, p, SamplingParams{}, stop).ids;
    SpecOptions so;
    so.drafter = d.get();
    const auto r = generate(*target, nullptr, p, SamplingParams{}, stop, {}, so);
    EXPECT_EQ(r.ids, plain) << "prompt of " << len;
    for (size_t k = 0; k < r.spec.accepted.size(); ++k) accepted += r.spec.accepted[k], drafted += r.spec.proposed[k];
  }
  EXPECT_GT(drafted, 0);
  std::printf("[ cuda v4 dspark ] %lld drafts, %lld accepted\n", static_cast<long long>(drafted),
              static_cast<long long>(accepted));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The batched engine over the GPU target (its V4CudaState behind the paged interface,
// model/slot_state_paged_cache.h): concurrent requests, a pool small enough to preempt, and
// the checkpoint's DSpark drafter give each request the GPU target's own plain greedy ids.
TEST(CudaV4, BatchedEngineEqualsSingleRequestGreedy) {
  SKIP_WITHOUT_GPU();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dsinfer_cuda_v4eng_" + std::to_string(::getpid()));
  test::TinyDSparkSpec sp;
  test::write_tiny_v4_dspark(sp, dir.string());
  auto target = load_deepseek_v4_cuda(dir.string());
  auto d = load_drafter(dir.string(), *target);
  const int V = target->config().vocab_size;
  std::mt19937 rng(13);
  std::vector<std::vector<int32_t>> prompts, plain;
  std::vector<int> max_new;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p(1 + rng() % 50);
    for (auto& t : p) t = static_cast<int32_t>(3 + rng() % static_cast<unsigned>(V - 3));
    StopConditions stop;
    stop.max_tokens = 4 + static_cast<int>(rng() % 30);
    plain.push_back(generate(*target, nullptr, p, SamplingParams{}, stop).ids);
    prompts.push_back(p);
    max_new.push_back(stop.max_tokens);
  }
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "plain" : variant == 1 ? "plain, preempting" : "dspark, preempting");
    EngineOptions o;
    o.max_running = 6;
    o.max_batch_tokens = 64;
    o.max_model_len = 128;
    if (variant >= 1) {
      o.kv_block_size = 4;
      o.kv_num_blocks = 40;
      o.shard_count = 1;
    }
    if (variant == 2) o.drafter = d.get();
    LLMEngine engine(*target, o);
    std::map<uint64_t, std::vector<int32_t>> got;
    std::map<uint64_t, std::string> reason, error;
    std::map<uint64_t, size_t> case_of;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest req;
      req.prompt = prompts[i];
      req.stop.max_tokens = max_new[i];
      req.on_event = [&](const RequestEvent& ev) {
        got[ev.id].insert(got[ev.id].end(), ev.new_ids.begin(), ev.new_ids.end());
        if (ev.finished) reason[ev.id] = ev.finish_reason, error[ev.id] = ev.error;
      };
      case_of[engine.submit(std::move(req))] = i;
    }
    engine.run_until_idle();
    for (const auto& [id, i] : case_of) {
      EXPECT_EQ(reason[id], "length") << "request " << i << ": " << error[id];
      EXPECT_EQ(got[id], plain[i]) << "request " << i;
    }
    if (variant >= 1) {
      EXPECT_GT(engine.stats().preemptions, 0u);
    }
    if (variant == 2) {
      EXPECT_GT(engine.stats().verified_draft_tokens, 0u);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(CudaV4, BadInputGivesErrors) {
  SKIP_WITHOUT_GPU();
  const std::string dir = (kRoot / "mixed4_f32").string();
  auto m = load_deepseek_v4_cuda(dir);
  auto other = load_deepseek_v4_cuda(dir);
  auto kv = m->make_kv_cache(1, 8);
  ForwardOutput out;
  ForwardBatch b;
  b.entries.push_back({0, {1, m->config().vocab_size}, {1}});
  EXPECT_THROW(m->forward(*kv, b, out), Error);  // token id outside the vocabulary
  b.entries[0] = {0, std::vector<int32_t>(9, 1), {}};
  EXPECT_THROW(m->forward(*kv, b, out), Error);  // capacity
  b.entries[0] = {1, {1}, {}};
  EXPECT_THROW(m->forward(*kv, b, out), Error);  // slot
  auto kv_other = other->make_kv_cache(1, 8);
  b.entries[0] = {0, {1}, {0}};
  EXPECT_THROW(m->forward(*kv_other, b, out), Error);  // another model's state
  EXPECT_EQ(kv->length(0), 0);  // nothing was written
  m->forward(*kv, b, out);
  EXPECT_EQ(kv->length(0), 1);
  EXPECT_THROW(kv->truncate(0, 2), Error);
  EXPECT_THROW(m->make_kv_cache(1, 1 << 30), Error);  // state beyond device memory
}

#else
TEST(CudaV4, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without DSINFER_CUDA"; }
#endif
