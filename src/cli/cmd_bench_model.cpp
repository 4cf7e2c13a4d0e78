// dsinfer CLI: `dsinfer bench-model`. Measures the bare model forward on this machine:
// prefill tokens/s (one forward over --prompt-tokens tokens) and batch-1 decode tokens/s
// (--decode-tokens forwards of one token each, greedy), then sets decode against the
// memory-bandwidth roofline: decode must stream every weight once per token, so
// tokens/s <= bandwidth / weight bytes per token. Prompt tokens are pseudo-random ids from a
// fixed seed, so runs are comparable. One warm-up decode pass first pages the weights in.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "kernels/cpu/matmul.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/membw.h"
#include "model/model.h"
#include "sampling/sampler.h"
#ifdef DSINFER_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsinfer::cli {

namespace {

struct BenchModelArgs {
  std::string matmul_precision = "auto";
  std::string model_path;
  int threads = 0;
  int prompt_tokens = 128;
  int decode_tokens = 64;
  int repeat = 3;
  bool json = false;
  std::vector<int> verify_blocks;  // --verify-blocks: time one verify forward of B rows per B
  int verify_reps = 30;
  DeviceArgs dev;  // --device cpu|cuda: on cuda, decode returns only argmax ids to the host
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run_bench_model(const BenchModelArgs& a) {
  check(a.prompt_tokens >= 1, "--prompt-tokens must be >= 1");
  check(a.decode_tokens >= 1, "--decode-tokens must be >= 1");
  check(a.repeat >= 1, "--repeat must be >= 1");
  ThreadPool::set_global_threads(a.threads);
  apply_matmul_precision(a.matmul_precision);
  const int threads = ThreadPool::global().size();
  const double t_load0 = now_s();
  auto model = load_model_on_device(a.model_path, a.dev);
  const double load_s = now_s() - t_load0;
  const ModelConfig& c = model->config();
  const int V = c.vocab_size;

  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(a.prompt_tokens);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  int max_block = 1;
  for (int b : a.verify_blocks) {
    check(b >= 1 && b <= 256, "--verify-blocks: block sizes must be in [1, 256]");
    max_block = std::max(max_block, b);
  }
  auto kv = model->make_kv_cache(1, a.prompt_tokens + std::max(a.decode_tokens, max_block) + 8);
  ForwardOutput out;

  // Warm-up: a short prefill and a decode step fault every weight page in, so the timed
  // runs measure streaming from memory, not from disk.
  {
    ForwardBatch b;
    b.entries.push_back({0, {prompt[0], prompt[0]}, {1}});
    model->forward(*kv, b, out);
    b.entries[0] = {0, {prompt[0]}, {0}};
    model->forward(*kv, b, out);
    kv->clear(0);
  }

  // Each repetition starts from an empty cache: prefill the prompt, then decode greedily.
  // Reported: the median repetition (typical) and the best (least disturbed by other load
  // on a shared machine); the roofline percentage uses the best, like the bandwidth probe.
  std::vector<double> prefill_runs, decode_runs;
  for (int rep = 0; rep < a.repeat; ++rep) {
    kv->clear(0);
    ForwardBatch pre;
    pre.entries.push_back({0, prompt, {a.prompt_tokens - 1}});
    const double t0 = now_s();
    model->forward(*kv, pre, out);
    prefill_runs.push_back(now_s() - t0);
    int next = argmax(out.logits.data(), V);
    ForwardBatch dec;
    dec.entries.push_back({0, {next}, {0}});
    std::vector<int32_t> ids;
    const double t1 = now_s();
    for (int i = 0; i < a.decode_tokens; ++i) {
      dec.entries[0].tokens[0] = next;
      model->forward_argmax(*kv, dec, out, ids);  // a GPU model sends back the id alone
      next = ids.at(0);
    }
    decode_runs.push_back(now_s() - t1);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const double prefill_s = *std::min_element(prefill_runs.begin(), prefill_runs.end());
  const double decode_s = *std::min_element(decode_runs.begin(), decode_runs.end());
  const double prefill_tps_median = a.prompt_tokens / median(prefill_runs);
  const double decode_tps_median = a.decode_tokens / median(decode_runs);

  // Verify cost at batch 1: after the prompt, one forward of B new rows of one sequence with
  // every row's argmax back (what a speculative verify step of B - 1 drafts runs), rolled
  // back after each; median of verify_reps (after one untimed run of each shape, which on the
  // GPU also captures its graph). The target-only speedup at acceptance length tau with
  // blocks of B is tau * t(1) / t(B) (drafting cost not included).
  nlohmann::json verify = nlohmann::json::array();
  if (!a.verify_blocks.empty()) {
    kv->clear(0);
    ForwardBatch pre;
    pre.entries.push_back({0, prompt, {a.prompt_tokens - 1}});
    model->forward(*kv, pre, out);
    std::vector<int32_t> ids;
    for (int B : a.verify_blocks) {
      ForwardBatch vb;
      ForwardEntry e;
      e.slot = 0;
      for (int i = 0; i < B; ++i) {
        e.tokens.push_back(prompt[static_cast<size_t>(i) % prompt.size()]);
        e.logit_rows.push_back(i);
      }
      vb.entries.push_back(e);
      std::vector<double> t;
      for (int rep = 0; rep < a.verify_reps + 2; ++rep) {
        const double t0 = now_s();
        model->forward_argmax(*kv, vb, out, ids);
        const double dt = now_s() - t0;
        kv->truncate(0, a.prompt_tokens);
        if (rep >= 2) t.push_back(dt);
      }
      verify.push_back({{"block", B}, {"ms_median", 1e3 * median(t)}, {"ms_best", 1e3 * *std::min_element(t.begin(), t.end())}});
    }
    const double t1 = verify[0].at("ms_median").get<double>();
    for (auto& v : verify) v["cost_vs_first"] = v.at("ms_median").get<double>() / t1;
  }

  double bw = 0.0;
  if (device_is_cuda(a.dev)) {
#ifdef DSINFER_HAS_CUDA
    bw = cuda_copy_bandwidth_gbs();  // device-to-device copy, bytes read + written
#endif
  } else {
    bw = measure_memory_bandwidth_gbs(threads);
  }
  const std::string device = device_summary(a.dev);
  const double bytes = static_cast<double>(model->decode_weight_bytes());
  const double prefill_tps = a.prompt_tokens / prefill_s;
  const double decode_tps = a.decode_tokens / decode_s;
  const double roofline = bytes > 0 ? bw * 1e9 / bytes : 0.0;
  const double pct = roofline > 0 ? 100.0 * decode_tps / roofline : 0.0;

  if (a.json) {
    nlohmann::json j = {{"model_path", a.model_path},
                        {"architecture", c.architecture},
                        {"threads", threads},
                        {"device", device},
                        {"isa", isa_level_name(isa_level())},
                        {"matmul_precision", matmul_precision_name(matmul_precision())},
                        {"load_s", load_s},
                        {"prompt_tokens", a.prompt_tokens},
                        {"decode_tokens", a.decode_tokens},
                        {"prefill_s", prefill_s},
                        {"prefill_tokens_per_s", prefill_tps},
                        {"decode_s", decode_s},
                        {"decode_tokens_per_s", decode_tps},
                        {"repeat", a.repeat},
                        {"prefill_tokens_per_s_median", prefill_tps_median},
                        {"decode_tokens_per_s_median", decode_tps_median},
                        {"weight_bytes_per_decode_token", bytes},
                        {"memory_bandwidth_gbs", bw},
                        {"roofline_decode_tokens_per_s", roofline},
                        {"roofline_pct", pct}};
    if (!verify.empty()) j["verify_blocks"] = verify;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model            %s (%s, %d layers, hidden %d)\n", a.model_path.c_str(), c.architecture.c_str(),
                c.num_hidden_layers, c.hidden_size);
    std::printf("threads          %d (isa %s, matmul %s), load %.2f s\n", threads, isa_level_name(isa_level()),
                matmul_precision_name(matmul_precision()), load_s);
    std::printf("prefill          %d tokens: best %.1f tokens/s, median %.1f (%d runs)\n", a.prompt_tokens, prefill_tps,
                prefill_tps_median, a.repeat);
    std::printf("decode (batch 1) %d tokens: best %.2f tokens/s, median %.2f (%d runs)\n", a.decode_tokens, decode_tps,
                decode_tps_median, a.repeat);
    std::printf("weights/token    %.1f MB\n", bytes / 1e6);
    std::printf("device           %s\n", device.c_str());
    std::printf("memory bandwidth %.2f GB/s (measured, %s)\n", bw,
                device_is_cuda(a.dev) ? "device-to-device copy, read + write" : (std::to_string(threads) + " threads").c_str());
    std::printf("roofline         %.2f tokens/s; decode reaches %.1f%% of it\n", roofline, pct);
    for (const auto& v : verify)
      std::printf("verify block %3d %.3f ms median (%.2fx the first block size)\n", v.at("block").get<int>(),
                  v.at("ms_median").get<double>(), v.at("cost_vs_first").get<double>());
  }
  return 0;
}

}  // namespace

Runner register_bench_model(CLI::App& app) {
  auto args = std::make_shared<BenchModelArgs>();
  CLI::App* sub = app.add_subcommand("bench-model", "Measure prefill/decode speed of a model against the memory roofline");
  sub->add_option("--model-path", args->model_path, "Hugging Face model directory")->required();
  sub->add_option("--threads", args->threads, "Worker threads (0 = all hardware threads)");
  add_matmul_precision_option(sub, &args->matmul_precision);
  add_device_options(sub, &args->dev);
  sub->add_option("--prompt-tokens", args->prompt_tokens, "Tokens in the timed prefill")->capture_default_str();
  sub->add_option("--decode-tokens", args->decode_tokens, "Tokens in the timed batch-1 decode")->capture_default_str();
  sub->add_option("--repeat", args->repeat, "Timed repetitions (best and median reported)")->capture_default_str();
  sub->add_option("--verify-blocks", args->verify_blocks,
                  "Also time one verify forward of B rows of one sequence (all rows' argmax) for each B, e.g. 1,2,4,8,16")
      ->delimiter(',');
  sub->add_option("--verify-reps", args->verify_reps, "Timed verify forwards per block size (median reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return [args] { return run_bench_model(*args); };
}

}  // namespace dsinfer::cli
