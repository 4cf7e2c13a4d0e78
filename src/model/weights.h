// dsinfer model floor: the weight registry an architecture loads its parameters from.
//
// Data flow: WeightStore opens every safetensors shard of a model directory (SafetensorsSet)
// and hands out typed views by name. `require` checks dtype and shape against what the
// config implies and names file, tensor, expected and actual on mismatch. Matrices stay in
// the mmap (BF16/F32, no copy) unless LoadOptions asks for a conversion, in which case the
// store owns the converted copy; small vectors (norm weights, biases) are always returned
// as F32 copies because the kernels that use them take F32.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/matmul.h"
#include "model/safetensors.h"

namespace dsinfer {

struct WeightInfo {
  std::string name;
  std::string file;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
};

class WeightStore {
 public:
  // weight_dtype: "auto" (F16 → F32, others as stored), "f32" (everything → F32),
  // "bf16" (F32/F16 → BF16). Anything else throws naming the option.
  // placement: how the files are held (MappedFile); a store that reads a few small tensors
  // of a large checkpoint another store already holds maps them (Mmap) instead of copying.
  WeightStore(const std::string& model_dir, const std::string& weight_dtype,
              MappedFile::Placement placement = MappedFile::Placement::Auto);

  bool has(const std::string& name) const { return set_->find(name) != nullptr; }
  // The raw tensor after checking that it exists, its dtype is one of `dtypes` and its
  // shape equals `shape`. Errors: "<file>: tensor '<name>': shape [a, b] but the config
  // implies [c, d]" / "... dtype I32 not one of F32, BF16, F16" / "<dir>: tensor '<name>'
  // not found in model.safetensors".
  WeightInfo require(const std::string& name, const std::vector<DType>& dtypes, const std::vector<int64_t>& shape) const;

  // A [rows, cols] matrix as a matmul view, converted per the load option (the converted
  // copy lives as long as the store).
  WeightView matrix(const std::string& name, int64_t rows, int64_t cols);
  // A [rows, cols] matrix read elsewhere (a tensor-parallel rank's slice, ShardReader), held
  // as matrix() holds a tensor of the files: converted by the same rule, the same AMX layout,
  // counted in matrix_bytes(). name: for errors.
  WeightView adopt(const std::string& name, DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> bytes);
  // A vector of n floats (norm weight, bias), converted to F32.
  std::vector<float> vector_f32(const std::string& name, int64_t n) const;

  // Total bytes of the weights handed out through matrix() in their in-memory dtype.
  uint64_t matrix_bytes() const { return matrix_bytes_; }
  // Bytes of the AMX layouts made at load (0 where matmul does not run on AMX).
  uint64_t amx_bytes() const { return amx_bytes_; }
  const std::string& model_dir() const { return dir_; }

 private:
  // matrix() / adopt() after their checks: convert (or copy when misaligned) per the load
  // option, count, lay out for AMX.
  WeightView hold(const std::string& name, const uint8_t* src, DType src_dtype, int64_t rows, int64_t cols);
  std::string dir_;
  std::string weight_dtype_;
  std::unique_ptr<SafetensorsSet> set_;
  struct FreeDeleter {
    void operator()(uint16_t* p) const { std::free(p); }
  };
  std::deque<std::vector<uint8_t>> owned_;  // converted copies (deque: stable addresses)
  std::deque<std::unique_ptr<uint16_t, FreeDeleter>> packed_;  // AMX layouts (matmul.h)
  uint64_t matrix_bytes_ = 0;
  uint64_t amx_bytes_ = 0;
};

// Element i of a tensor of the given float dtype, as F32 (unaligned-safe).
float load_as_f32(const uint8_t* data, DType dt, int64_t i);

}  // namespace dsinfer
