// dsinfer model floor: tensor parallelism inside one process, on the CPU (issue 10).
//
// (Expert parallelism for DeepSeek-V4's MoE blocks runs in the same group:
// load_expert_parallel.)
//
// The deployment form of tensor parallelism is one process per GPU with NCCL all-reduces
// (not built yet: no multi-GPU machine to run it on). This is its CPU stand-in, which runs
// the same split end to end where CI can: a TensorParallelModel holds one rank model per
// rank (load_qwen3_rank: its heads, its features, its own KV caches), and its forward runs
// every rank's forward at once, one thread per rank; the ranks meet in HostAllReduce after
// every layer's o and down projections, as NCCL ranks would, and rank 0's output (logits,
// captures) is the answer. Greedy decoding through it equals the single model's to the
// rounding of the changed summation order (tests/unit/test_model_tensor_parallel.cpp).
//
// Caches: make_kv_cache gives one dense cache per rank behind one KVCache (lengths kept in
// step); make_paged_kv_cache one paged cache per rank behind one BlockKVCache (the engine's
// tables bound, truncated and copied on every rank), so the batched engine serves a split
// model unchanged.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/model.h"

namespace dsinfer {

// The all-reduce of `ranks` threads: sum(rank, data, n) blocks until every rank has called
// it with its n values, then leaves in every rank's data the sum over ranks, added in rank
// order (so every rank holds the same bits). abort() makes every waiting and later call
// throw, so a rank that failed cannot leave the others waiting forever.
class HostAllReduce {
 public:
  explicit HostAllReduce(int ranks);
  int ranks() const { return ranks_; }
  void sum(int rank, float* data, int64_t n);
  void abort();
  void reset();  // clears an abort (between forwards)

 private:
  void wait_phase(std::unique_lock<std::mutex>& lock, uint64_t phase);
  const int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float*> data_;
  std::vector<float> total_;
  int64_t n_ = -1;
  int arrived_ = 0, departed_ = 0;
  uint64_t phase_ = 0;
  bool aborted_ = false;
};

// Loads model_dir's Qwen3 checkpoint split over `ranks` ranks (plan_tensor_parallel's
// refusals name the config field that does not split).
std::unique_ptr<Model> load_tensor_parallel(const std::string& model_dir, int ranks, const LoadOptions& opts = {});

// model_dir's DeepSeek-V4 checkpoint with its routed experts split over `ranks` ranks
// (plan_expert_parallel: contiguous ranges; the rest of the model replicated on every rank),
// the ranks' routed MoE outputs summed in rank order (expert parallelism on CPU threads).
std::unique_ptr<Model> load_expert_parallel(const std::string& model_dir, int ranks, const LoadOptions& opts = {});

// The group over rank models already made (their reduce hooks call group->sum with their
// rank): what load_tensor_parallel returns, and what a backend's ranks are wrapped in
// (load_qwen3_cuda_tensor_parallel, cuda_backend.h). full: the whole model's config.
std::unique_ptr<Model> make_tensor_parallel_model(const ModelConfig& full, std::vector<std::unique_ptr<Model>> ranks,
                                                  std::shared_ptr<HostAllReduce> group);

}  // namespace dsinfer
