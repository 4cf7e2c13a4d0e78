// dsinfer core: mmap-backed read-only files and small text file reading.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dsinfer {

namespace {

// Bytes of memory the kernel reports as available (0 if unknown).
size_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

MappedFile::Placement resolve_placement(MappedFile::Placement p, size_t size) {
  if (const char* env = std::getenv("DSINFER_WEIGHTS")) {
    if (std::strcmp(env, "mmap") == 0) return MappedFile::Placement::Mmap;
    if (std::strcmp(env, "resident") == 0) return MappedFile::Placement::Resident;
  }
  if (p != MappedFile::Placement::Auto) return p;
  // Copied (huge pages, every page present from the start) while that leaves at least half
  // of the available memory free (KV cache, activations, other processes). Small files too:
  // left in the page-cache mapping, a drafter's 18 MB faulted in 4 KB pages during the first
  // decoding rounds (~10 ms in a VM, several decode steps) and then cost TLB misses every step.
  // Below one huge page a copy gains nothing.
  if (size < (size_t{2} << 20)) return MappedFile::Placement::Mmap;
  const size_t avail = mem_available_bytes();
  return (avail > 0 && size <= avail / 2) ? MappedFile::Placement::Resident : MappedFile::Placement::Mmap;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, Placement placement) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw Error(path + ": cannot mmap: " + std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
    mapped_size_ = size_;
    if (resolve_placement(placement, size_) == Placement::Resident) {
      const size_t huge = size_t{2} << 20;
      const size_t rounded = (size_ + huge - 1) / huge * huge;
      void* a = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (a != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
        ::madvise(a, rounded, MADV_HUGEPAGE);  // a hint: fine if transparent huge pages are off
#endif
        std::memcpy(a, p, size_);
        ::mprotect(a, rounded, PROT_READ);
        ::munmap(p, size_);
        data_ = static_cast<const uint8_t*>(a);
        mapped_size_ = rounded;
        resident_ = true;
      }  // else: keep the page-cache mapping
    }
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), mapped_size_);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path + ": cannot open for writing");
  out << text;
  out.flush();
  if (!out) throw Error(path + ": write failed");
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace dsinfer
