// dsinfer model floor: weight registry (see weights.h). Conversions happen once at load;
// the forward pass only ever sees F32 or BF16 matrices and F32 vectors.
#include "model/weights.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace dsinfer {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

float load_as_f32(const uint8_t* data, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return f16_to_f32(h);
    }
    default:
      throw Error(std::string("load_as_f32: not a float dtype: ") + dtype_name(dt));
  }
}

WeightStore::WeightStore(const std::string& model_dir, const std::string& weight_dtype,
                         MappedFile::Placement placement)
    : dir_(model_dir), weight_dtype_(weight_dtype) {
  if (weight_dtype != "auto" && weight_dtype != "f32" && weight_dtype != "bf16")
    throw Error("weight dtype option '" + weight_dtype + "': expected auto, f32 or bf16");
  set_ = SafetensorsSet::open_dir(model_dir, placement);
}

WeightInfo WeightStore::require(const std::string& name, const std::vector<DType>& dtypes,
                                const std::vector<int64_t>& shape) const {
  const TensorLocation* loc = set_->find(name);
  if (!loc) {
    std::string where = set_->files().size() == 1 ? set_->files()[0]->path() : dir_ + "/model.safetensors.index.json";
    throw Error(where + ": tensor '" + name + "' not found");
  }
  const SafetensorsTensor& t = *loc->tensor;
  const std::string what = loc->file->path() + ": tensor '" + name + "'";
  bool ok = false;
  std::string allowed;
  for (DType d : dtypes) {
    ok |= d == t.dtype;
    allowed += (allowed.empty() ? "" : ", ") + std::string(dtype_name(d));
  }
  if (!ok) throw Error(what + ": dtype " + dtype_name(t.dtype) + " not one of " + allowed);
  if (t.shape != shape) throw Error(what + ": shape " + shape_str(t.shape) + " but the config implies " + shape_str(shape));
  return WeightInfo{name, loc->file->path(), t.dtype, t.shape, loc->file->tensor_data(t), t.nbytes};
}

WeightView WeightStore::matrix(const std::string& name, int64_t rows, int64_t cols) {
  WeightInfo w = require(name, {DType::F32, DType::BF16, DType::F16}, {rows, cols});
  return hold(name, w.data, w.dtype, rows, cols);
}

WeightView WeightStore::adopt(const std::string& name, DType dtype, int64_t rows, int64_t cols,
                              std::vector<uint8_t> bytes) {
  check(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
        dir_ + ": tensor '" + name + "': dtype " + dtype_name(dtype) + " not one of F32, BF16, F16");
  check(bytes.size() == static_cast<size_t>(rows * cols) * dtype_size(dtype),
        dir_ + ": tensor '" + name + "': " + std::to_string(bytes.size()) + " bytes for a [" + std::to_string(rows) +
            ", " + std::to_string(cols) + "] " + dtype_name(dtype) + " slice");
  owned_.push_back(std::move(bytes));
  return hold(name, owned_.back().data(), dtype, rows, cols);
}

WeightView WeightStore::hold(const std::string& name, const uint8_t* src, DType src_dtype, int64_t rows, int64_t cols) {
  struct {
    const uint8_t* data;
    DType dtype;
    uint64_t nbytes;
  } w{src, src_dtype, static_cast<uint64_t>(rows * cols) * dtype_size(src_dtype)};
  DType target = w.dtype;
  if (weight_dtype_ == "f32") target = DType::F32;
  else if (weight_dtype_ == "bf16") target = DType::BF16;
  else if (w.dtype == DType::F16) target = DType::F32;  // "auto": the matmul kernels take F32/BF16
  // F32 read in place must be 4-byte aligned for the vector kernels' element loads to be
  // well defined; a file whose offsets are not gets a copy instead of a failure.
  bool misaligned = target == DType::F32 && reinterpret_cast<uintptr_t>(w.data) % 4 != 0;
  bool misaligned16 = target == DType::BF16 && reinterpret_cast<uintptr_t>(w.data) % 2 != 0;
  const uint8_t* data = w.data;
  const int64_t n = rows * cols;
  if (target != w.dtype || misaligned || misaligned16) {
    owned_.emplace_back(static_cast<size_t>(n) * dtype_size(target));
    uint8_t* dst = owned_.back().data();
    if (target == w.dtype) {
      std::memcpy(dst, w.data, w.nbytes);
    } else if (target == DType::F32) {
      for (int64_t i = 0; i < n; ++i) {
        float f = load_as_f32(w.data, w.dtype, i);
        std::memcpy(dst + 4 * i, &f, 4);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(load_as_f32(w.data, w.dtype, i));
        std::memcpy(dst + 2 * i, &h, 2);
      }
    }
    data = dst;
  }
  matrix_bytes_ += static_cast<uint64_t>(n) * dtype_size(target);
  WeightView view{data, target, rows, cols};
  if (amx_wants(view)) {
    // The AMX kernel reads its own layout of W (matmul.h). The original stays for row
    // lookups (tied embeddings) and other backends, so on AMX machines the BF16 matrices
    // take twice their size in memory (amx_bytes() more).
    // Big layouts on transparent huge pages, as MappedFile's resident copy (4 KiB pages
    // stall the hardware prefetchers at every page edge while decode streams W).
    const size_t huge = size_t{2} << 20;
    const size_t raw = static_cast<size_t>(amx_pack_elems(view)) * 2;
    const size_t align = raw >= huge ? huge : 64;
    const size_t bytes = (raw + align - 1) / align * align;
    packed_.emplace_back(static_cast<uint16_t*>(std::aligned_alloc(align, bytes)));
    check(packed_.back() != nullptr, "out of memory packing tensor '" + name + "' for AMX");
#ifdef MADV_HUGEPAGE
    if (align == huge) madvise(packed_.back().get(), bytes, MADV_HUGEPAGE);  // a hint
#endif
    amx_pack(view, packed_.back().get());
    view.amx_panels = packed_.back().get();
    amx_bytes_ += bytes;
  }
  return view;
}

std::vector<float> WeightStore::vector_f32(const std::string& name, int64_t n) const {
  WeightInfo w = require(name, {DType::F32, DType::BF16, DType::F16}, {n});
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = load_as_f32(w.data, w.dtype, i);
  return v;
}

}  // namespace dsinfer
