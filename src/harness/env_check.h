// dsinfer harness: `dsinfer check-env` — can this machine run this model, and how should
// `dsinfer serve` be started?
//
// Data flow: probe_system() (cpu_features, /proc/cpuinfo, /proc/meminfo, nvidia-smi when
// present) --> SystemInfo; check_model(dir, drafter dir) (load_model_config as the model
// floor does, the weights' files, the tokenizer and its chat template, parse_draft_config
// against the target, calibration.json, KV bytes per token from the config × the memory
// left after the weights) --> ModelCheck; assess() --> an availability score 0-100 with
// every reason that lowered it, a recommended command line, and can_run (the exit code).
// Nothing here loads weights; every check is file- and config-level.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsinfer::harness {

struct GpuInfo {
  std::string name, compute_capability, driver;
  double memory_total_mib = 0, memory_free_mib = 0;
};

struct SystemInfo {
  std::string cpu_model;
  bool avx2 = false, fma = false, avx512f = false, avx512bf16 = false, amx = false;
  std::string isa_level;              // what the kernels will use (DSINFER_ISA may cap it)
  std::string matmul_kernel;          // BF16 matmul kernel family (amx, avx512bf16, ...)
  int logical_cpus = 0, physical_cores = 0;
  uint64_t mem_total = 0, mem_available = 0;  // bytes
  bool nvidia_smi = false;
  std::string cuda_version;           // from nvidia-smi's header
  std::vector<GpuInfo> gpus;
  std::string gpu_note;               // why there is no GPU list
  bool built_with_cuda = false;
  // CUDA builds: the device as the backend's runtime sees it ("NVIDIA H200 (sm_90, 132 SMs,
  // 139.8 GiB)"), or "unavailable: <why>" (set by the caller, which links the backend).
  std::string cuda_backend;
};

SystemInfo probe_system(bool built_with_cuda);

// nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.free,driver_version
// --format=csv,noheader,nounits output -> GPUs; `banner` (plain nvidia-smi output) -> the
// "CUDA Version: X" field ("" when absent). Exposed for tests.
std::vector<GpuInfo> parse_gpu_csv(const std::string& csv);
std::string parse_cuda_version(const std::string& banner);

struct ModelCheck {
  std::string dir;
  bool config_ok = false, architecture_supported = false, weights_found = false;
  std::string architecture, error;
  uint64_t weight_bytes = 0;
  bool tokenizer_ok = false;
  std::string chat_template;          // family name, or "none"
  std::string drafter_dir, drafter_kind, drafter_error;
  bool drafter_found = false, drafter_compatible = false, confidence_head = false, calibration = false;
  uint64_t kv_bytes_per_token = 0;    // 0: not estimated for this architecture
  std::string kv_dtype;               // "BF16" (bf16 matmul precision, BF16 weights) or "F32"
  int max_model_len = 0;
  double kv_budget_bytes = 0;         // (available - weights) x prealloc ratio
  int64_t kv_tokens = 0;              // tokens that fit in that budget
  int full_length_sequences = 0;      // kv_tokens / max_model_len (and the per-sequence state)
  // DeepSeek-V4: decoding state every sequence holds whatever its length (window and raw
  // rows; V4State::bytes_bounded), beside kv_bytes_per_token for the compressed entries.
  uint64_t state_bytes_per_sequence = 0;
};

// drafter_dir "": looks for a drafter next to the model (DIR/../dspark, DIR/../dflash, the
// embedded layout) and inside it (DIR/drafter; a DeepSeek-V4 checkpoint's own mtp.* stages).
ModelCheck check_model(const std::string& dir, const std::string& drafter_dir, const SystemInfo& sys,
                       double prealloc_ratio);

struct Assessment {
  int score = 0;                      // 0-100
  bool can_run = false;
  std::vector<std::string> reasons;   // each "-N: why" or "fatal: why"
  std::string recommended_command;
};

Assessment assess(const SystemInfo& sys, const ModelCheck* model, double prealloc_ratio);

std::string format_report(const SystemInfo& sys, const ModelCheck* model, const Assessment& a, bool verbose);
nlohmann::json report_json(const SystemInfo& sys, const ModelCheck* model, const Assessment& a);

}  // namespace dsinfer::harness
