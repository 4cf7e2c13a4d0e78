// libFuzzer target: the safetensors header parser and tensor-table validation.
// Any byte string is fed to parse_safetensors_header() as if it were a mapped file. The
// parser must either throw dsinfer::Error or return a table whose every tensor lies inside
// the buffer, after the header, with nbytes == numel * dtype size and no two non-empty
// tensors overlapping; the first and last byte of each tensor are read so ASan would flag
// any out-of-bounds offset the checks let through.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer;
  try {
    SafetensorsHeader h = parse_safetensors_header(data, size, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    uint64_t prev_end = h.data_begin;
    for (const auto& t : h.tensors) {
      if (t.begin < h.data_begin || t.begin > size || t.nbytes > size - t.begin) std::abort();
      uint64_t n = dtype_size(t.dtype);
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      if (n != t.nbytes) std::abort();
      if (t.nbytes) {
        if (t.begin < prev_end) std::abort();  // sorted by offset, non-overlapping
        prev_end = t.begin + t.nbytes;
        sink = sink + data[t.begin] + data[t.begin + t.nbytes - 1];
      }
    }
    (void)sink;
  } catch (const Error&) {
  }
  return 0;
}
