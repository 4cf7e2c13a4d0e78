// dsinfer harness: system probe, model-directory checks and the availability score (see
// env_check.h). Score rules are listed in assess(); each deduction comes with its reason.
#include "harness/env_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "model/config.h"
#include "model/deepseek_v4_config.h"
#include "model/deepseek_v4_state.h"
#include "model/safetensors.h"
#include "spec/calibration.h"
#include "spec/drafter_loader.h"
#include "spec/v4_dspark_drafter.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::harness {

using nlohmann::json;

namespace {

uint64_t meminfo_kb(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0) return std::stoull(line.substr(key.size() + 1));
  return 0;
}

int physical_cores() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, phys = "0";
  std::set<std::string> cores;
  while (std::getline(in, line)) {
    const size_t c = line.find(':');
    if (c == std::string::npos) continue;
    std::string k = line.substr(0, c);
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    const std::string v = c + 2 <= line.size() ? line.substr(c + 2) : "";
    if (k == "physical id") phys = v;
    if (k == "core id") cores.insert(phys + "/" + v);
  }
  return static_cast<int>(cores.size());
}

// Runs a command, returns its stdout ("" and ok=false when it cannot run or fails).
std::string run_capture(const std::string& cmd, bool& ok) {
  ok = false;
  std::FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ok = pclose(p) == 0;
  return out;
}

std::string trim(std::string s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string gib(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

// The largest unit that keeps the number >= 1 (B, KiB, MiB, GiB).
std::string bytes_str(double b) {
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

uint64_t safetensors_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) total += e.file_size(ec);
  }
  return total;
}

// Whether any tensor of DIR's safetensors has `part` in its name (headers only; false when
// they cannot be read).
bool safetensors_has_tensor_containing(const std::string& dir, const std::string& part) {
  try {
    auto set = SafetensorsSet::open_dir(dir);
    for (const auto& [name, loc] : set->tensors())
      if (name.find(part) != std::string::npos) return true;
  } catch (const Error&) {
  }
  return false;
}

}  // namespace

SystemInfo probe_system(bool built_with_cuda) {
  SystemInfo s;
  const CpuFeatures& f = cpu_features();
  s.cpu_model = f.model_name.empty() ? "unknown" : f.model_name;
  s.avx2 = f.avx2;
  s.fma = f.fma;
  s.avx512f = f.avx512f;
  s.avx512bf16 = f.avx512bf16;
  s.amx = f.amx;
  s.isa_level = isa_level_name(isa_level());
  s.matmul_kernel = bf16_matmul_kernel_name();
  s.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  s.physical_cores = physical_cores();
  if (s.physical_cores <= 0) s.physical_cores = s.logical_cpus;
  s.mem_total = meminfo_kb("MemTotal") * 1024;
  s.mem_available = meminfo_kb("MemAvailable") * 1024;
  s.built_with_cuda = built_with_cuda;
  bool ok = false;
  const std::string csv = run_capture(
      "nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.free,driver_version --format=csv,noheader,nounits", ok);
  if (!ok) {
    s.gpu_note = "no NVIDIA GPU visible (nvidia-smi absent or failing)";
    return s;
  }
  s.nvidia_smi = true;
  s.gpus = parse_gpu_csv(csv);
  s.cuda_version = parse_cuda_version(run_capture("nvidia-smi", ok));
  if (s.gpus.empty()) s.gpu_note = "nvidia-smi lists no GPU";
  return s;
}

std::vector<GpuInfo> parse_gpu_csv(const std::string& csv) {
  std::vector<GpuInfo> out;
  std::istringstream lines(csv);
  std::string line;
  while (std::getline(lines, line)) {
    if (trim(line).empty()) continue;
    std::vector<std::string> f;
    std::istringstream cells(line);
    std::string c;
    while (std::getline(cells, c, ',')) f.push_back(trim(c));
    if (f.size() < 5) continue;
    // A name with commas: the last four fields are the numbers and the driver.
    GpuInfo g;
    for (size_t i = 0; i + 4 < f.size(); ++i) g.name += (i ? "," : "") + f[i];
    const size_t k = f.size() - 4;
    g.compute_capability = f[k];
    g.memory_total_mib = std::atof(f[k + 1].c_str());
    g.memory_free_mib = std::atof(f[k + 2].c_str());
    g.driver = f[k + 3];
    out.push_back(g);
  }
  return out;
}

std::string parse_cuda_version(const std::string& banner) {
  const size_t p = banner.find("CUDA Version:");
  if (p == std::string::npos) return "";
  const size_t start = banner.find_first_not_of(' ', p + 13);
  if (start == std::string::npos) return "";
  const size_t end = banner.find_first_of(" |\n", start);
  return banner.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

ModelCheck check_model(const std::string& dir, const std::string& drafter_dir, const SystemInfo& sys, double prealloc_ratio) {
  ModelCheck m;
  m.dir = dir;
  if (!file_exists(dir + "/config.json")) {
    m.error = dir + "/config.json: not found";
    return m;
  }
  ModelConfig cfg;
  try {
    cfg = load_model_config(dir);
    m.config_ok = true;
  } catch (const Error& e) {
    m.error = e.what();
    return m;
  }
  // The same dispatch as model/model.cpp load_model.
  m.architecture = cfg.architecture.empty() ? "model_type " + cfg.model_type : cfg.architecture;
  const bool qwen3 = is_qwen3(cfg);
  const bool v4 = is_deepseek_v4(cfg);
  m.architecture_supported = qwen3 || v4;
  m.weight_bytes = safetensors_bytes(dir);
  m.weights_found = m.weight_bytes > 0;
  if (file_exists(dir + "/tokenizer.json")) {
    try {
      auto tok = Tokenizer::load(dir);
      m.tokenizer_ok = true;
      switch (detect_chat_family(*tok)) {
        case ChatFamily::Qwen3ChatML: m.chat_template = "Qwen3 ChatML"; break;
        case ChatFamily::DeepSeekV3: m.chat_template = "DeepSeek-V3"; break;
        case ChatFamily::DeepSeekV4: m.chat_template = "DeepSeek-V4"; break;
        case ChatFamily::None: m.chat_template = "none"; break;
      }
    } catch (const Error& e) {
      m.error = e.what();
    }
  }
  // Drafter: the given one, else a DeepSeek-V4 checkpoint's own mtp.* stages, else the
  // embedded layout's neighbours.
  std::vector<std::string> candidates;
  if (!drafter_dir.empty()) candidates.push_back(drafter_dir);
  else if (v4 && has_v4_dspark_stages(dir)) candidates.push_back(dir);
  else
    for (const char* c : {"/../dspark", "/../dflash", "/drafter"}) candidates.push_back(dir + c);
  for (const std::string& d : candidates) {
    // A DeepSeek-V4 checkpoint holds its drafter as mtp.* stages (serve --spec dspark finds
    // them without a path); any other directory is a drafter checkpoint of its own.
    const bool v4_stages = v4 && is_deepseek_v4_dir(d);
    if (!v4_stages && !file_exists(d + "/config.json")) continue;
    m.drafter_found = true;
    m.drafter_dir = std::filesystem::weakly_canonical(d).string();
    try {
      if (v4_stages) {
        const V4DSparkConfig dc = parse_v4_dspark_config(d, parse_deepseek_v4_config(cfg));
        m.drafter_kind = "dspark (DeepSeek-V4 mtp.*, block " + std::to_string(dc.block_size) + ")";
        m.confidence_head = safetensors_has_tensor_containing(d, "confidence_head.");
      } else {
        const DraftConfig dc = parse_draft_config(d, cfg);
        m.confidence_head = dc.confidence_head;
        m.drafter_kind = dc.dialect == DraftDialect::ZLab ? "dflash (z-lab)"
                         : (dc.markov_rank > 0 || dc.confidence_head) ? "dspark"
                                                                       : "dflash (DeepSpec)";
      }
      m.drafter_compatible = true;
      m.calibration = file_exists(d + "/calibration.json");
      // `serve` refuses a calibration.json made for other weights: so does this check.
      if (m.calibration) load_calibration(d);
    } catch (const Error& e) {
      m.drafter_compatible = false;
      m.drafter_error = e.what();
    }
    break;
  }
  if (!drafter_dir.empty() && !m.drafter_found) m.drafter_error = drafter_dir + "/config.json: not found";
  // KV: the paged pool stores K and V in BF16 when the model commands' default matmul
  // precision (bf16 unless DSINFER_MATMUL=f32) meets BF16 weights, else in F32 (the rule of
  // Model::kv_dtype(); engine/block_pool.h KVLayout).
  m.max_model_len = std::min(cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096, 4096);
  if (v4) {
    // The batched engine's rule for a per-sequence state (Model::paged_state_shape): the
    // compressed entries per token, the window and raw rows per sequence; F32 on the CPU.
    try {
      const DeepseekV4Config vc = parse_deepseek_v4_config(cfg);
      m.kv_dtype = "F32 state";
      m.kv_bytes_per_token = std::max<uint64_t>(V4State::bytes_per_token(vc), 1);
      m.state_bytes_per_sequence = V4State::bytes_bounded(vc);
      const double left = static_cast<double>(sys.mem_available) - static_cast<double>(m.weight_bytes);
      m.kv_budget_bytes = std::max(0.0, left * prealloc_ratio);
      const double per_seq = static_cast<double>(m.kv_bytes_per_token) * m.max_model_len +
                             static_cast<double>(m.state_bytes_per_sequence);
      m.full_length_sequences = static_cast<int>(std::min(1e9, m.kv_budget_bytes / per_seq));
      m.kv_tokens = static_cast<int64_t>(static_cast<double>(m.full_length_sequences) * m.max_model_len);
    } catch (const Error& e) {
      m.error = e.what();
    }
  } else if (qwen3 && cfg.num_hidden_layers > 0 && cfg.num_key_value_heads > 0 && cfg.head_dim > 0) {
    const char* prec = std::getenv("DSINFER_MATMUL");
    const bool bf16_kv = cfg.torch_dtype == "bfloat16" && !(prec && std::string(prec) == "f32");
    m.kv_dtype = bf16_kv ? "BF16" : "F32";
    m.kv_bytes_per_token =
        2ull * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * (bf16_kv ? 2u : sizeof(float));
    const double left = static_cast<double>(sys.mem_available) - static_cast<double>(m.weight_bytes);
    m.kv_budget_bytes = std::max(0.0, left * prealloc_ratio);
    m.kv_tokens = static_cast<int64_t>(m.kv_budget_bytes / static_cast<double>(m.kv_bytes_per_token));
    m.full_length_sequences = static_cast<int>(m.kv_tokens / std::max(1, m.max_model_len));
  }
  return m;
}

Assessment assess(const SystemInfo& sys, const ModelCheck* m, double prealloc_ratio) {
  Assessment a;
  a.score = 100;
  bool fatal = false;
  const auto minus = [&](int n, const std::string& why) {
    a.score -= n;
    a.reasons.push_back("-" + std::to_string(n) + ": " + why);
  };
  const auto fail = [&](const std::string& why) {
    fatal = true;
    a.reasons.push_back("fatal: " + why);
  };
  if (!sys.avx2) minus(40, "no AVX2/FMA: the scalar kernels run (several times slower)");
  else if (!sys.avx512f) minus(5, "no AVX-512: the AVX2 kernels run");
  if (sys.avx512f && !sys.avx512bf16) minus(3, "no AVX512_BF16: bf16 matmuls are emulated");
  if (sys.logical_cpus < 4) minus(10, std::to_string(sys.logical_cpus) + " hardware threads: little room for concurrent requests");
  if (sys.mem_available < (1ull << 30)) minus(10, "less than 1 GiB of memory available");
  if (m) {
    if (!m->config_ok) fail(m->error);
    else {
      if (!m->architecture_supported) fail("architecture " + m->architecture + " is not supported (Qwen3ForCausalLM, DeepseekV4ForCausalLM)");
      if (!m->weights_found) fail(m->dir + ": no *.safetensors weights");
      if (!m->tokenizer_ok) fail(m->dir + "/tokenizer.json: " + (m->error.empty() ? "not found" : m->error));
      else if (m->chat_template == "none") minus(5, "no known chat template: /v1/chat/completions will refuse requests");
      if (m->weight_bytes > sys.mem_available) fail("weights (" + gib(m->weight_bytes) + ") exceed the available memory (" + gib(sys.mem_available) + ")");
      // A --draft-model-path that does not exist is a wrong command line (serve exits on it), not
      // a finding about the model: fatal. A drafter that exists but does not fit is a deduction.
      if (!m->drafter_found && !m->drafter_error.empty()) fail("--draft-model-path: " + m->drafter_error);
      else if (!m->drafter_found) minus(15, "no drafter: plain decoding only (pass --draft-model-path)");
      else if (!m->drafter_compatible) minus(20, "drafter not usable: " + m->drafter_error);
      else {
        if (!m->confidence_head) minus(5, "drafter has no confidence head: no DSpark scheduling (fixed-length verification)");
        else if (!m->calibration) minus(3, "drafter has no calibration.json: raw confidences (run dsinfer calibrate)");
      }
      if (m->kv_bytes_per_token > 0) {
        if (m->full_length_sequences < 1) fail("KV pool too small for one " + std::to_string(m->max_model_len) + "-token sequence");
        else if (m->full_length_sequences < 8)
          minus(10, "KV pool holds only " + std::to_string(m->full_length_sequences) + " full-length sequences");
      }
    }
  }
  a.score = std::max(0, fatal ? 0 : a.score);
  a.can_run = !fatal;
  if (m && a.can_run) {
    std::string c = "dsinfer serve --model-path " + m->dir;
    if (m->drafter_compatible) {
      c += " --draft-model-path " + m->drafter_dir;
      if (m->confidence_head) c += " --enable-dspark";
    } else {
      c += " --spec none";
    }
    const int threads = std::max(1, sys.physical_cores);
    c += " --threads " + std::to_string(threads);
    if (m->kv_bytes_per_token > 0) {
      const int running = std::clamp(m->full_length_sequences, 1, 64);
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.2g", prealloc_ratio);
      c += " --max-running " + std::to_string(running) + " --cache-prealloc-ratio " + ratio;
    }
    a.recommended_command = c;
  } else if (!m) {
    a.recommended_command = "dsinfer serve --threads " + std::to_string(std::max(1, sys.physical_cores)) +
                            "  (the embedded model; pass --model-path DIR to check yours)";
  }
  return a;
}

std::string format_report(const SystemInfo& s, const ModelCheck* m, const Assessment& a, bool verbose) {
  std::string o;
  const auto yes = [](bool b) { return b ? "yes" : "no"; };
  o += "CPU: " + s.cpu_model + "\n";
  o += std::string("  ISA: AVX2 ") + yes(s.avx2) + ", FMA " + yes(s.fma) + ", AVX-512 " + yes(s.avx512f) + ", AVX512_BF16 " +
       yes(s.avx512bf16) + ", AMX " + yes(s.amx) + "; kernels use " + s.isa_level + ", BF16 matmul " + s.matmul_kernel + "\n";
  o += "  cores: " + std::to_string(s.physical_cores) + " physical, " + std::to_string(s.logical_cpus) + " hardware threads\n";
  o += "Memory: " + gib(static_cast<double>(s.mem_total)) + " total, " + gib(static_cast<double>(s.mem_available)) + " available\n";
  if (s.gpus.empty()) {
    o += "GPU: " + s.gpu_note + "\n";
  } else {
    for (size_t i = 0; i < s.gpus.size(); ++i) {
      const GpuInfo& g = s.gpus[i];
      char buf[256];
      std::snprintf(buf, sizeof buf, "GPU %zu: %s, compute capability %s, %.0f MiB free of %.0f MiB, driver %s", i, g.name.c_str(),
                    g.compute_capability.c_str(), g.memory_free_mib, g.memory_total_mib, g.driver.c_str());
      o += buf;
      o += s.cuda_version.empty() ? "\n" : ", CUDA " + s.cuda_version + "\n";
    }
  }
  o += std::string("  this build: ") + (s.built_with_cuda ? "with the CUDA backend (--device cuda)" : "CPU only") +
       (s.cuda_backend.empty() ? "" : ": " + s.cuda_backend) + "\n";
  if (m) {
    o += "Model: " + m->dir + "\n";
    if (!m->config_ok) o += "  config: " + m->error + "\n";
    else {
      o += "  architecture: " + m->architecture + (m->architecture_supported ? " (supported)" : " (NOT supported)") + "\n";
      o += "  weights: " + (m->weights_found ? bytes_str(static_cast<double>(m->weight_bytes)) : std::string("not found")) + "\n";
      o += "  tokenizer: " + std::string(m->tokenizer_ok ? "ok" : "missing or invalid") +
           (m->tokenizer_ok ? ", chat template: " + m->chat_template : "") + "\n";
      if (m->drafter_found)
        o += "  drafter: " + m->drafter_dir + ": " +
             (m->drafter_compatible ? m->drafter_kind + ", compatible" + std::string(m->confidence_head ? ", confidence head" : "") +
                                          (m->calibration ? ", calibrated" : "")
                                    : "NOT compatible: " + m->drafter_error) +
             "\n";
      else
        o += "  drafter: none found" + (m->drafter_error.empty() ? std::string() : " (" + m->drafter_error + ")") + "\n";
      if (m->kv_bytes_per_token > 0 && m->state_bytes_per_sequence > 0) {
        o += "  KV: " + bytes_str(static_cast<double>(m->kv_bytes_per_token)) + " per token + " +
             bytes_str(static_cast<double>(m->state_bytes_per_sequence)) + " per sequence (" + m->kv_dtype +
             ", no prefix cache); budget " + gib(m->kv_budget_bytes) + " -> " + std::to_string(m->full_length_sequences) +
             " sequences of " + std::to_string(m->max_model_len) + "\n";
      } else if (m->kv_bytes_per_token > 0) {
        o += "  KV: " + bytes_str(static_cast<double>(m->kv_bytes_per_token)) + " per token (" + m->kv_dtype + " K+V); budget " +
             gib(m->kv_budget_bytes) + " -> " + std::to_string(m->kv_tokens) + " tokens = " +
             std::to_string(m->full_length_sequences) + " sequences of " + std::to_string(m->max_model_len) + "\n";
      } else {
        o += "  KV: capacity not estimated for this architecture\n";
      }
    }
  }
  o += "Availability score: " + std::to_string(a.score) + "/100" + (a.can_run ? "" : " (cannot run)") + "\n";
  if (verbose || !a.can_run)
    for (const std::string& r : a.reasons) o += "  " + r + "\n";
  else if (!a.reasons.empty())
    o += "  " + std::to_string(a.reasons.size()) + " deduction(s); --verbose lists them\n";
  if (!a.recommended_command.empty()) o += "Recommended: " + a.recommended_command + "\n";
  return o;
}

json report_json(const SystemInfo& s, const ModelCheck* m, const Assessment& a) {
  json gpus = json::array();
  for (const GpuInfo& g : s.gpus)
    gpus.push_back({{"name", g.name}, {"compute_capability", g.compute_capability}, {"memory_total_mib", g.memory_total_mib},
                    {"memory_free_mib", g.memory_free_mib}, {"driver", g.driver}});
  json j = {{"cpu", {{"model", s.cpu_model}, {"avx2", s.avx2}, {"fma", s.fma}, {"avx512f", s.avx512f},
                     {"avx512bf16", s.avx512bf16}, {"amx", s.amx}, {"isa_level", s.isa_level}, {"matmul_kernel", s.matmul_kernel},
                     {"physical_cores", s.physical_cores}, {"logical_cpus", s.logical_cpus}}},
            {"memory", {{"total_bytes", s.mem_total}, {"available_bytes", s.mem_available}}},
            {"gpus", gpus},
            {"gpu_note", s.gpu_note},
            {"cuda_version", s.cuda_version},
            {"built_with_cuda", s.built_with_cuda},
            {"cuda_backend", s.cuda_backend},
            {"score", a.score},
            {"can_run", a.can_run},
            {"reasons", a.reasons},
            {"recommended_command", a.recommended_command}};
  if (m)
    j["model"] = {{"dir", m->dir}, {"config_ok", m->config_ok}, {"architecture", m->architecture},
                  {"architecture_supported", m->architecture_supported}, {"weights_bytes", m->weight_bytes},
                  {"tokenizer_ok", m->tokenizer_ok}, {"chat_template", m->chat_template}, {"drafter_dir", m->drafter_dir},
                  {"drafter_kind", m->drafter_kind}, {"drafter_compatible", m->drafter_compatible},
                  {"drafter_error", m->drafter_error}, {"confidence_head", m->confidence_head},
                  {"calibration", m->calibration}, {"kv_bytes_per_token", m->kv_bytes_per_token}, {"kv_dtype", m->kv_dtype},
                  {"kv_budget_bytes", m->kv_budget_bytes}, {"kv_tokens", m->kv_tokens},
                  {"max_model_len", m->max_model_len}, {"full_length_sequences", m->full_length_sequences},
                  {"state_bytes_per_sequence", m->state_bytes_per_sequence}, {"error", m->error}};
  return j;
}

}  // namespace dsinfer::harness
