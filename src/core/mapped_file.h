// dsinfer core: a read-only memory-mapped file.
//
// Two placements of the bytes:
//  - Mmap: used in place from the page cache (no copy; costs virtual memory only). Fine
//    for headers and for models larger than RAM, but streaming weights through 4 KiB
//    page-cache pages costs decode speed: hardware prefetchers stop at every page edge and
//    the TLB misses on every page (measured: ~3x slower batch-1 decode than below).
//  - Resident: the file is mapped, then copied once into anonymous memory backed by
//    transparent huge pages (2 MiB), and the mapping is dropped. Costs the file's size in
//    RAM and a copy at load; decode then streams weights at memory bandwidth.
// Auto picks Resident for files of 2 MiB and more when they fit comfortably in available
// memory (DSINFER_WEIGHTS = mmap | resident overrides it for the whole process).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dsinfer {

class MappedFile {
 public:
  enum class Placement { Auto, Mmap, Resident };
  // Maps the whole file; throws Error naming the path when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path, Placement placement = Placement::Auto);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // True when the bytes live in anonymous (huge-page) memory rather than the page cache.
  bool resident() const { return resident_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_size_ = 0;  // length of the mapping to unmap (rounded up when resident)
  bool resident_ = false;
};

// Reads a whole (small) text file; throws Error naming the path.
std::string read_text_file(const std::string& path);
// Writes (truncates) a whole text file; throws Error naming the path.
void write_text_file(const std::string& path, const std::string& text);
bool file_exists(const std::string& path);

}  // namespace dsinfer
