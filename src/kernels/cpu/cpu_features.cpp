// dsinfer kernels: run-time CPU feature detection (cpuid via the compiler builtins).
#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace dsinfer {

static CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
#endif
  // F16C, AVX512-BF16 and AMX are read from /proc/cpuinfo flags (older compilers lack
  // the builtin names for them).
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (f.model_name.empty() && line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) f.model_name = line.substr(p + 2);
    }
    if (line.rfind("flags", 0) == 0) {
      auto has = [&](const char* flag) {
        std::string pat = std::string(" ") + flag;
        auto p = line.find(pat);
        return p != std::string::npos && (p + pat.size() == line.size() || line[p + pat.size()] == ' ');
      };
      f.f16c = has("f16c");
      f.avx512bf16 = has("avx512_bf16");
      f.amx = has("amx_tile");
      f.amx_bf16 = has("amx_bf16");
      break;
    }
  }
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

IsaLevel isa_level() {
  static const IsaLevel level = [] {
    const auto& f = cpu_features();
    IsaLevel best = IsaLevel::Scalar;
    if (f.avx2 && f.fma && f.f16c) best = IsaLevel::Avx2;
    if (best == IsaLevel::Avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) best = IsaLevel::Avx512;
    if (const char* cap = std::getenv("DSINFER_ISA")) {
      IsaLevel c = best;
      if (std::strcmp(cap, "scalar") == 0) c = IsaLevel::Scalar;
      else if (std::strcmp(cap, "avx2") == 0) c = IsaLevel::Avx2;
      else if (std::strcmp(cap, "avx512") == 0) c = IsaLevel::Avx512;
      if (static_cast<int>(c) < static_cast<int>(best)) best = c;
    }
    return best;
  }();
  return level;
}

const char* isa_level_name(IsaLevel l) {
  switch (l) {
    case IsaLevel::Scalar: return "scalar";
    case IsaLevel::Avx2: return "avx2";
    case IsaLevel::Avx512: return "avx512";
  }
  return "?";
}

}  // namespace dsinfer
