// dsinfer model floor: the safetensors reader.
//
// Data flow: a .safetensors file is [8-byte little-endian header length N][N bytes of JSON
// header][data region]. parse_safetensors_header() takes the raw bytes (a mapped file or,
// for the fuzzer, any buffer), checks every bound, and returns a table of tensors whose
// offsets point into that buffer. SafetensorsFile maps a file and keeps the mapping alive
// so the tensor bytes can be used in place (weights are never copied unless converted).
// Sharded checkpoints (model.safetensors.index.json) are resolved by open_safetensors_dir().
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace dsinfer {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset from the start of the buffer (not of the data region)
  uint64_t nbytes = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct SafetensorsHeader {
  uint64_t header_len = 0;
  uint64_t data_begin = 0;  // 8 + header_len
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
  std::vector<SafetensorsTensor> tensors;       // in file order of their data offsets
};

// Parses and validates the header of a safetensors buffer of `size` bytes. `file` is used in
// error messages only. Throws Error("<file>: tensor '<name>': ...") on any violation:
// short buffer, header length beyond the buffer, invalid/duplicate JSON, unknown dtype,
// bad shape, offsets outside the data region, size != numel * dtype size, overlaps.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& file);

// One mapped safetensors file with its validated tensor table.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path, MappedFile::Placement placement = MappedFile::Placement::Auto);
  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const uint8_t* tensor_data(const SafetensorsTensor& t) const { return file_.data() + t.begin; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// Where a tensor lives: the shard that holds it and its entry there.
struct TensorLocation {
  const SafetensorsFile* file = nullptr;
  const SafetensorsTensor* tensor = nullptr;
};

// All safetensors of a model directory: either DIR/model.safetensors, or the shards named by
// DIR/model.safetensors.index.json ("weight_map": {tensor: shard file}). Checks that every
// shard exists, every tensor the index names is in its shard, and that no tensor name
// appears in two shards.
class SafetensorsSet {
 public:
  // placement: how every shard is held (MappedFile; Auto copies shards that fit to huge pages).
  static std::unique_ptr<SafetensorsSet> open_dir(const std::string& model_dir,
                                                  MappedFile::Placement placement = MappedFile::Placement::Auto);
  const TensorLocation* find(const std::string& name) const;
  const std::map<std::string, TensorLocation>& tensors() const { return by_name_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorLocation> by_name_;
};

// Writes a safetensors file (used by make-random-model and the tests). Tensors are laid out
// contiguously in the order given; the header is space-padded so the data region starts at
// a multiple of 8 (as the reference writer does), which keeps F32 tensors 4-byte aligned
// when their sizes are. A tensor's bytes come from `data`, or, when that is null, from
// `fill(dst)` called with a buffer of its size (so multi-GB models stream to disk).
struct SafetensorsWriteItem {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes
  std::function<void(uint8_t* dst)> fill;
};
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dsinfer
