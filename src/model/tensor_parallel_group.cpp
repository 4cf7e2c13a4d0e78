// dsinfer model floor: in-process tensor parallelism on the CPU (see tensor_parallel_group.h).
#include "model/tensor_parallel_group.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/block_kv_cache.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v4_config.h"
#include "model/qwen3.h"
#include "model/tensor_parallel.h"

namespace dsinfer {

HostAllReduce::HostAllReduce(int ranks) : ranks_(ranks), data_(static_cast<size_t>(ranks), nullptr) {
  if (ranks < 1) throw Error("tensor-parallel group: ranks must be >= 1 (got " + std::to_string(ranks) + ")");
}

void HostAllReduce::sum(int rank, float* data, int64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) throw Error("tensor-parallel all-reduce: another rank failed");
  if (rank < 0 || rank >= ranks_ || data_[static_cast<size_t>(rank)] != nullptr)
    throw Error("tensor-parallel all-reduce: rank " + std::to_string(rank) + " out of range or arrived twice");
  if (n_ >= 0 && n != n_) {
    aborted_ = true;
    cv_.notify_all();
    throw Error("tensor-parallel all-reduce: rank " + std::to_string(rank) + " brought " + std::to_string(n) +
                " values where the others brought " + std::to_string(n_));
  }
  n_ = n;
  data_[static_cast<size_t>(rank)] = data;
  if (++arrived_ < ranks_) {
    wait_phase(lock, phase_);
    return;
  }
  // The last rank in: the sum in rank order, written into every rank's buffer (the others
  // wait, so their buffers are idle), then the next round may begin.
  total_.assign(static_cast<size_t>(n), 0.0f);
  for (int r = 0; r < ranks_; ++r) {
    const float* d = data_[static_cast<size_t>(r)];
    for (int64_t i = 0; i < n; ++i) total_[static_cast<size_t>(i)] += d[i];
  }
  for (int r = 0; r < ranks_; ++r) {
    float* d = data_[static_cast<size_t>(r)];
    for (int64_t i = 0; i < n; ++i) d[i] = total_[static_cast<size_t>(i)];
    data_[static_cast<size_t>(r)] = nullptr;
  }
  arrived_ = 0;
  n_ = -1;
  ++phase_;
  cv_.notify_all();
}

void HostAllReduce::wait_phase(std::unique_lock<std::mutex>& lock, uint64_t phase) {
  cv_.wait(lock, [&] { return phase_ != phase || aborted_; });
  if (phase_ == phase) throw Error("tensor-parallel all-reduce: another rank failed");
}

void HostAllReduce::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void HostAllReduce::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  arrived_ = 0;
  n_ = -1;
  for (auto& d : data_) d = nullptr;
}

namespace {

// One dense cache per rank (each holds that rank's KV heads), lengths in step.
class TensorParallelKVCache final : public KVCache {
 public:
  explicit TensorParallelKVCache(std::vector<std::unique_ptr<KVCache>> ranks) : ranks_(std::move(ranks)) {}
  int max_slots() const override { return ranks_[0]->max_slots(); }
  int max_tokens() const override { return ranks_[0]->max_tokens(); }
  int length(int slot) const override { return ranks_[0]->length(slot); }
  void truncate(int slot, int new_length) override {
    for (auto& r : ranks_) r->truncate(slot, new_length);
  }
  KVCache& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }

 private:
  std::vector<std::unique_ptr<KVCache>> ranks_;
};

// The engine's paged cache over one paged cache per rank: the bookkeeping (tables, lengths)
// here, every bind, truncate and block copy repeated on each rank's storage, so the ranks'
// K/V stay at the same block ids; lengths are taken back from rank 0 after a forward.
class TensorParallelBlockKVCache final : public BlockKVCache {
 public:
  TensorParallelBlockKVCache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                             std::vector<std::unique_ptr<BlockKVCache>> ranks)
      : BlockKVCache("tensor-parallel paged KV cache", block_size, num_blocks, max_slots, max_tokens),
        ranks_(std::move(ranks)) {}
  void truncate(int slot, int new_length) override {
    BlockKVCache::truncate(slot, new_length);
    for (auto& r : ranks_) r->truncate(slot, new_length);
  }
  void copy_block(int32_t src, int32_t dst, int n_tokens) override {
    check_copy(src, dst, n_tokens);
    for (auto& r : ranks_) r->copy_block(src, dst, n_tokens);
  }
  void prefault() override {
    for (auto& r : ranks_) r->prefault();
  }
  BlockKVCache& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  // After a forward: the lengths the ranks' forwards set.
  void take_lengths(const ForwardBatch& batch) {
    for (const ForwardEntry& e : batch.entries) set_length(e.slot, ranks_[0]->length(e.slot));
  }

 protected:
  void on_bind(int slot, std::span<const int32_t> blocks) override {
    for (auto& r : ranks_) r->bind(slot, blocks, length(slot));
  }

 private:
  std::vector<std::unique_ptr<BlockKVCache>> ranks_;
};

// The thread of one rank (1 ..) for the group's life, with a kernel pool of its own (a pool
// takes one caller at a time): it runs one job per forward and sleeps in between (never
// spins). The calling thread runs rank 0. A thread started per forward would cost tens of
// microseconds every step.
class RankWorker {
 public:
  RankWorker() : pool_(1), thread_([this] { loop(); }) {}
  ~RankWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      done_ = false;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  void loop() {
    ThreadPool::set_thread_pool(&pool_);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;  // stopping, nothing left to run
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      job();  // catches its own errors (TensorParallelModel::forward)
      lock.lock();
      done_ = true;
      cv_.notify_all();
    }
  }
  ThreadPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true, stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const ModelConfig& cfg, std::vector<std::unique_ptr<Model>> ranks,
                      std::shared_ptr<HostAllReduce> group)
      : cfg_(cfg), group_(std::move(group)), ranks_(std::move(ranks)) {
    if (ranks_.empty() || static_cast<int>(ranks_.size()) != group_->ranks())
      throw Error("tensor-parallel group: " + std::to_string(ranks_.size()) + " rank models for a group of " +
                  std::to_string(group_->ranks()));
    for (size_t r = 1; r < ranks_.size(); ++r) workers_.push_back(std::make_unique<RankWorker>());
  }

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const override {
    std::vector<std::unique_ptr<KVCache>> caches;
    for (const auto& m : ranks_) caches.push_back(m->make_kv_cache(max_slots, max_tokens));
    return std::make_unique<TensorParallelKVCache>(std::move(caches));
  }
  DType kv_dtype() const override { return ranks_[0]->kv_dtype(); }
  // Blocks every rank's device pool holds (each rank keeps its KV heads on its own device;
  // the engine gives all ranks the same block ids): the fewest; 0 for host ranks.
  int64_t device_kv_blocks(int block_size, double prealloc_ratio, int feature_floats) const override {
    (void)feature_floats;  // no feature rows in the ranks' pools (below)
    int64_t blocks = -1;
    for (const auto& m : ranks_) {
      const int64_t b = m->device_kv_blocks(block_size, prealloc_ratio, 0);
      blocks = blocks < 0 ? b : std::min(blocks, b);
    }
    return std::max<int64_t>(blocks, 0);
  }
  // No feature rows next to the K/V (the engine then keeps the drafter's in its own store).
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override {
    (void)feature_floats;
    std::vector<std::unique_ptr<BlockKVCache>> caches;
    for (const auto& m : ranks_) caches.push_back(m->make_paged_kv_cache(block_size, num_blocks, max_slots, max_tokens, 0));
    return std::make_unique<TensorParallelBlockKVCache>(block_size, num_blocks, max_slots, max_tokens, std::move(caches));
  }

  void forward(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out) override {
    auto* tp = dynamic_cast<TensorParallelKVCache*>(&kv);
    auto* paged = tp ? nullptr : dynamic_cast<TensorParallelBlockKVCache*>(&kv);
    if (!tp && !paged)
      throw Error("forward: KV cache was not made by this tensor-parallel model's make_kv_cache or make_paged_kv_cache");
    auto rank_cache = [&](int r) -> KVCache& { return tp ? tp->rank(r) : static_cast<KVCache&>(paged->rank(r)); };
    const int n = static_cast<int>(ranks_.size());
    group_->reset();
    std::vector<ForwardOutput> outs(static_cast<size_t>(n));
    std::vector<std::exception_ptr> errs(static_cast<size_t>(n));
    auto run = [&](int r, ForwardOutput& o) {
      try {
        ranks_[static_cast<size_t>(r)]->forward(rank_cache(r), batch, o);
      } catch (...) {
        errs[static_cast<size_t>(r)] = std::current_exception();
        group_->abort();
      }
    };
    for (int r = 1; r < n; ++r) workers_[static_cast<size_t>(r - 1)]->start([&, r] { run(r, outs[static_cast<size_t>(r)]); });
    run(0, out);
    for (auto& w : workers_) w->wait();
    for (const auto& e : errs)  // rank 0's error first: a bad batch fails every rank alike
      if (e) std::rethrow_exception(e);
    if (paged) paged->take_lengths(batch);
  }

  void embed(const int32_t* ids, int n, float* out) const override { ranks_[0]->embed(ids, n, out); }
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override {
    ranks_[0]->lm_head(hidden, n, logits, apply_norm);
  }
  const WeightView* host_embedding() const override { return ranks_[0]->host_embedding(); }
  const WeightView* host_lm_head() const override { return ranks_[0]->host_lm_head(); }
  // What one rank streams per token: its share and the replicated head.
  uint64_t decode_weight_bytes() const override { return ranks_[0]->decode_weight_bytes(); }

 private:
  ModelConfig cfg_;
  std::shared_ptr<HostAllReduce> group_;
  std::vector<std::unique_ptr<Model>> ranks_;
  std::vector<std::unique_ptr<RankWorker>> workers_;  // ranks 1 ..
};

}  // namespace

namespace {

// Unless ok: the one-line refusal naming config.json's field and what it declares.
void require_architecture(const ModelConfig& cfg, bool ok, const std::string& what) {
  if (!ok)
    throw Error(cfg.model_dir + "/config.json: field 'architectures': " + what + " (got '" +
                (cfg.architecture.empty() ? cfg.model_type : cfg.architecture) + "')");
}

// The group of `ranks` rank models make_rank(r, reduce) builds, every reduce summing
// through one HostAllReduce.
std::unique_ptr<Model> host_group(const ModelConfig& cfg, int ranks,
                                  const std::function<std::unique_ptr<Model>(int, RankReduce)>& make_rank) {
  auto group = std::make_shared<HostAllReduce>(ranks);
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < ranks; ++r) models.push_back(make_rank(r, [group, r](float* d, int64_t n) { group->sum(r, d, n); }));
  return make_tensor_parallel_model(cfg, std::move(models), std::move(group));
}

}  // namespace

std::unique_ptr<Model> load_tensor_parallel(const std::string& model_dir, int ranks, const LoadOptions& opts) {
  const ModelConfig cfg = load_model_config(model_dir);
  require_architecture(cfg, is_qwen3(cfg), "tensor parallelism supports Qwen3 dense models only");
  const TensorParallelPlan plan = plan_tensor_parallel(cfg, ranks);
  return host_group(cfg, ranks, [&](int r, RankReduce reduce) {
    Qwen3RankOptions ro;
    ro.plan = plan;
    ro.rank = r;
    ro.reduce = std::move(reduce);
    return load_qwen3_rank(cfg, opts, ro);
  });
}

std::unique_ptr<Model> load_expert_parallel(const std::string& model_dir, int ranks, const LoadOptions& opts) {
  const ModelConfig cfg = load_model_config(model_dir);
  require_architecture(cfg, is_deepseek_v4(cfg), "expert parallelism supports DeepSeek-V4 models only");
  const auto ranges = plan_expert_parallel(parse_deepseek_v4_config(cfg).experts, ranks,
                                           model_dir + "/config.json: field 'n_routed_experts'");
  return host_group(cfg, ranks, [&](int r, RankReduce reduce) {
    V4ExpertRankOptions ro;
    ro.expert_begin = ranges[static_cast<size_t>(r)].first;
    ro.expert_end = ranges[static_cast<size_t>(r)].second;
    ro.reduce = std::move(reduce);
    return load_deepseek_v4_rank(cfg, opts, ro);
  });
}

std::unique_ptr<Model> make_tensor_parallel_model(const ModelConfig& full, std::vector<std::unique_ptr<Model>> ranks,
                                                  std::shared_ptr<HostAllReduce> group) {
  return std::make_unique<TensorParallelModel>(full, std::move(ranks), std::move(group));
}

}  // namespace dsinfer
