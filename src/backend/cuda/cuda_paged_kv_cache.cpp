// dsinfer CUDA backend: the device paged KV pool (see cuda_paged_kv_cache.h). Block ids and
// lengths are checked by BlockKVCache (model/block_kv_cache.cpp, the same rules and messages
// as the CPU's PagedKVCache), so a bad table never becomes a wild device write.
#include "backend/cuda/cuda_paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace dsinfer::cuda {

CudaPagedKVCache::CudaPagedKVCache(int n_layers, int n_kv_heads, int head_dim, int block_size, int64_t num_blocks,
                                   int max_slots, int max_tokens, int feature_floats)
    : BlockKVCache("CUDA paged KV cache", block_size, num_blocks, max_slots, max_tokens),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      uid_(next_kv_storage_uid()) {
  check(n_layers >= 1 && n_kv_heads >= 1 && head_dim >= 1, "CUDA paged KV cache: empty layer geometry");
  check(feature_floats >= 0, "CUDA paged KV cache: negative feature row width");
  feature_floats_ = feature_floats;
  block_stride_ = static_cast<int64_t>(n_kv_heads) * block_size * head_dim;
  table_stride_ = (max_tokens + block_size - 1) / block_size;
  const size_t bytes = static_cast<size_t>(n_layers) * static_cast<size_t>(num_blocks) * block_stride_ * sizeof(bf16);
  const size_t table_bytes = static_cast<size_t>(max_slots) * table_stride_ * sizeof(int32_t);
  auto release = [&] {
    cudaFree(k_);
    cudaFree(v_);
    cudaFree(feat_);
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
  if (feature_floats > 0) {
    const size_t fbytes = static_cast<size_t>(num_blocks) * block_size * feature_floats * sizeof(bf16);
    const cudaError_t e = cudaMalloc(&feat_, fbytes);
    if (e != cudaSuccess) {
      release();
      throw Error("CUDA paged KV cache: cannot allocate " + std::to_string(fbytes >> 20) + " MiB for drafter feature rows (" +
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
  dirty_lo_ = 0;
  dirty_hi_ = max_slots - 1;
}

CudaPagedKVCache::~CudaPagedKVCache() {
  cudaFree(k_);
  cudaFree(v_);
  cudaFree(feat_);
  cudaFree(table_dev_);
  cudaFreeHost(table_host_);
}

void CudaPagedKVCache::on_bind(int slot, std::span<const int32_t> blocks) {
  // Only the first table_stride_ blocks can hold positions < max_tokens.
  int32_t* row = table_host_ + static_cast<int64_t>(slot) * table_stride_;
  const size_t n = std::min<size_t>(blocks.size(), static_cast<size_t>(table_stride_));
  if (n) std::memcpy(row, blocks.data(), n * sizeof(int32_t));
  dirty_lo_ = dirty_lo_ > dirty_hi_ ? slot : std::min(dirty_lo_, slot);
  dirty_hi_ = std::max(dirty_hi_, slot);
}

void CudaPagedKVCache::copy_block(int32_t src, int32_t dst, int n_tokens) {
  check_copy(src, dst, n_tokens);
  if (src == dst || n_tokens == 0) return;
  // One 2D copy per (layer, K/V): the kv heads are the rows (pitch block_size * head_dim),
  // n_tokens * head_dim elements of each. The model's forwards end with a stream
  // synchronisation, and these run on the legacy stream followed by one, so no forward
  // overlaps them.
  const size_t pitch = static_cast<size_t>(block_size()) * head_dim_ * sizeof(bf16);
  const size_t width = static_cast<size_t>(n_tokens) * head_dim_ * sizeof(bf16);
  for (int l = 0; l < n_layers_; ++l)
    for (bf16* base : {k_, v_}) {
      bf16* layer = base + static_cast<int64_t>(l) * num_blocks() * block_stride_;
      DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(layer + dst * block_stride_, pitch, layer + src * block_stride_, pitch, width,
                                           n_kv_heads_, cudaMemcpyDeviceToDevice, nullptr));
    }
  if (feat_) {
    const size_t row = static_cast<size_t>(feature_floats_) * sizeof(bf16), per_block = row * block_size();
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(feat_) + dst * per_block,
                                       reinterpret_cast<const char*>(feat_) + src * per_block, n_tokens * row,
                                       cudaMemcpyDeviceToDevice, nullptr));
  }
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

uint64_t CudaPagedKVCache::pending_table_bytes() const {
  if (dirty_lo_ > dirty_hi_) return 0;
  return static_cast<uint64_t>(dirty_hi_ - dirty_lo_ + 1) * table_stride_ * sizeof(int32_t);
}

void CudaPagedKVCache::upload(cudaStream_t stream) {
  if (dirty_lo_ > dirty_hi_) return;
  const int64_t off = static_cast<int64_t>(dirty_lo_) * table_stride_;
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(table_dev_ + off, table_host_ + off, pending_table_bytes(), cudaMemcpyHostToDevice,
                                     stream));
  dirty_lo_ = 0;
  dirty_hi_ = -1;
}

KVLayerView CudaPagedKVCache::layer(int l) const {
  KVLayerView v;
  v.head_stride = static_cast<int64_t>(block_size()) * head_dim_;
  v.slot_stride = block_stride_;
  const int64_t off = static_cast<int64_t>(l) * num_blocks() * block_stride_;
  v.k = k_ + off;
  v.v = v_ + off;
  v.table = table_dev_;
  v.table_stride = table_stride_;
  v.block_size = block_size();
  return v;
}

}  // namespace dsinfer::cuda
