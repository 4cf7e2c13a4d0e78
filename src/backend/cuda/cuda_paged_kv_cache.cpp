// dsinfer CUDA backend: the device paged KV pool (see cuda_paged_kv_cache.h). Every block id
// and length from a caller is checked with dsinfer::Error (the same rules and messages as
// the CPU's PagedKVCache), so a bad table never becomes a wild device write.
#include "backend/cuda/cuda_paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace dsinfer::cuda {

CudaPagedKVCache::CudaPagedKVCache(int n_layers, int n_kv_heads, int head_dim, int block_size, int64_t num_blocks,
                                   int max_slots, int max_tokens)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      block_size_(block_size),
      num_blocks_(num_blocks),
      max_tokens_(max_tokens),
      uid_(next_kv_storage_uid()) {
  check(n_layers >= 1 && n_kv_heads >= 1 && head_dim >= 1, "CUDA paged KV cache: empty layer geometry");
  check(block_size >= 1, "CUDA paged KV cache: block_size must be >= 1 (got " + std::to_string(block_size) + ")");
  check(num_blocks >= 1, "CUDA paged KV cache: num_blocks must be >= 1 (got " + std::to_string(num_blocks) + ")");
  check(max_slots >= 1, "CUDA paged KV cache: max_slots must be >= 1 (got " + std::to_string(max_slots) + ")");
  check(max_tokens >= 1, "CUDA paged KV cache: max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
  block_stride_ = static_cast<int64_t>(n_kv_heads) * block_size * head_dim;
  table_stride_ = (max_tokens + block_size - 1) / block_size;
  const size_t bytes = static_cast<size_t>(n_layers) * static_cast<size_t>(num_blocks) * block_stride_ * sizeof(bf16);
  const size_t table_bytes = static_cast<size_t>(max_slots) * table_stride_ * sizeof(int32_t);
  auto release = [&] {
    cudaFree(k_);
    cudaFree(v_);
    cudaFree(table_dev_);
    cudaFreeHost(table_host_);
  };
  for (auto [ptr, what] : {std::pair<bf16**, const char*>{&k_, "K"}, {&v_, "V"}}) {
    const cudaError_t e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
      release();
      throw Error("CUDA paged KV cache: cannot allocate " + std::to_string(bytes >> 20) + " MiB for " + what + " (" +
                  std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) +
                  " tokens; lower --kv-blocks or --cache-prealloc-ratio): " + cudaGetErrorString(e));
    }
  }
  cudaError_t e = cudaMalloc(&table_dev_, table_bytes);
  if (e == cudaSuccess) e = cudaMallocHost(&table_host_, table_bytes);
  if (e != cudaSuccess) {
    release();
    throw_cuda(e, "cudaMalloc(paged KV block tables)", __FILE__, __LINE__);
  }
  std::memset(table_host_, 0, table_bytes);
  slots_.resize(static_cast<size_t>(max_slots));
}

CudaPagedKVCache::~CudaPagedKVCache() {
  cudaFree(k_);
  cudaFree(v_);
  cudaFree(table_dev_);
  cudaFreeHost(table_host_);
}

void CudaPagedKVCache::check_slot(int slot, const char* what) const {
  if (slot < 0 || slot >= max_slots())
    throw Error(std::string("paged KV cache ") + what + ": slot " + std::to_string(slot) + " out of range [0, " +
                std::to_string(max_slots()) + ")");
}

int CudaPagedKVCache::length(int slot) const {
  check_slot(slot, "length");
  return slots_[static_cast<size_t>(slot)].length;
}

void CudaPagedKVCache::truncate(int slot, int new_length) {
  check_slot(slot, "truncate");
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (new_length < 0 || new_length > s.length)
    throw Error("paged KV cache truncate: slot " + std::to_string(slot) + ": new length " + std::to_string(new_length) +
                " not in [0, " + std::to_string(s.length) + "]");
  s.length = new_length;
}

void CudaPagedKVCache::bind(int slot, std::span<const int32_t> blocks, int length) {
  check_slot(slot, "bind");
  for (int32_t b : blocks)
    if (b < 0 || b >= num_blocks_)
      throw Error("paged KV cache bind: slot " + std::to_string(slot) + ": block id " + std::to_string(b) +
                  " outside [0, " + std::to_string(num_blocks_) + ")");
  const int64_t cap = static_cast<int64_t>(blocks.size()) * block_size_;
  if (length < 0 || length > cap || length > max_tokens_)
    throw Error("paged KV cache bind: slot " + std::to_string(slot) + ": length " + std::to_string(length) +
                " not in [0, " + std::to_string(std::min<int64_t>(cap, max_tokens_)) + "]");
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.blocks.assign(blocks.begin(), blocks.end());
  s.length = length;
  // Only the first table_stride_ blocks can hold positions < max_tokens.
  int32_t* row = table_host_ + static_cast<int64_t>(slot) * table_stride_;
  const size_t n = std::min<size_t>(blocks.size(), static_cast<size_t>(table_stride_));
  if (n) std::memcpy(row, blocks.data(), n * sizeof(int32_t));
  tables_dirty_ = true;
}

std::span<const int32_t> CudaPagedKVCache::blocks(int slot) const {
  check_slot(slot, "blocks");
  return slots_[static_cast<size_t>(slot)].blocks;
}

int CudaPagedKVCache::capacity(int slot) const {
  check_slot(slot, "capacity");
  const int64_t cap = static_cast<int64_t>(slots_[static_cast<size_t>(slot)].blocks.size()) * block_size_;
  return static_cast<int>(std::min<int64_t>(cap, max_tokens_));
}

void CudaPagedKVCache::copy_block(int32_t src, int32_t dst, int n_tokens) {
  if (src < 0 || src >= num_blocks_ || dst < 0 || dst >= num_blocks_ || n_tokens < 0 || n_tokens > block_size_)
    throw Error("paged KV cache copy_block: block " + std::to_string(src) + " -> " + std::to_string(dst) + " (" +
                std::to_string(n_tokens) + " tokens) out of range");
  if (src == dst || n_tokens == 0) return;
  // One 2D copy per (layer, K/V): the kv heads are the rows (pitch block_size * head_dim),
  // n_tokens * head_dim elements of each. The model's forwards end with a stream
  // synchronisation, and these run on the legacy stream followed by one, so no forward
  // overlaps them.
  const size_t pitch = static_cast<size_t>(block_size_) * head_dim_ * sizeof(bf16);
  const size_t width = static_cast<size_t>(n_tokens) * head_dim_ * sizeof(bf16);
  for (int l = 0; l < n_layers_; ++l)
    for (bf16* base : {k_, v_}) {
      bf16* layer = base + static_cast<int64_t>(l) * num_blocks_ * block_stride_;
      DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(layer + dst * block_stride_, pitch, layer + src * block_stride_, pitch, width,
                                           n_kv_heads_, cudaMemcpyDeviceToDevice, nullptr));
    }
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void CudaPagedKVCache::set_length(int slot, int len) {
  check_slot(slot, "set_length");
  if (len < 0 || len > capacity(slot))
    throw Error("paged KV cache: slot " + std::to_string(slot) + " overflow: " + std::to_string(len) +
                " tokens > capacity " + std::to_string(capacity(slot)));
  slots_[static_cast<size_t>(slot)].length = len;
}

void CudaPagedKVCache::upload(cudaStream_t stream) {
  if (!tables_dirty_) return;
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(table_dev_, table_host_, slots_.size() * table_stride_ * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream));
  tables_dirty_ = false;
}

KVLayerView CudaPagedKVCache::layer(int l) const {
  KVLayerView v;
  v.head_stride = static_cast<int64_t>(block_size_) * head_dim_;
  v.slot_stride = block_stride_;
  const int64_t off = static_cast<int64_t>(l) * num_blocks_ * block_stride_;
  v.k = k_ + off;
  v.v = v_ + off;
  v.table = table_dev_;
  v.table_stride = table_stride_;
  v.block_size = block_size_;
  return v;
}

}  // namespace dsinfer::cuda
