// dsinfer kernels: what the CPU can do, checked once at run time. Kernels compiled with
// AVX2/FMA/F16C (or AVX-512) are only called when these say the CPU has them; otherwise
// the scalar versions run. DSINFER_ISA=scalar|avx2|avx512 caps the level (tests use it to
// check that every path gives the same bits where the contract says it must).
#pragma once
#include <string>

namespace dsinfer {

enum class IsaLevel { Scalar = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
  bool amx = false;       // amx_tile
  bool amx_bf16 = false;
  std::string model_name;
};

const CpuFeatures& cpu_features();
// The ISA level kernels use: the best the CPU supports, capped by DSINFER_ISA if set.
IsaLevel isa_level();
const char* isa_level_name(IsaLevel l);

}  // namespace dsinfer
