// dsinfer speculation floor: draft checkpoint loading (see drafter_loader.h).
// config.json is read twice: once by load_model_config for the Qwen3-style backbone fields
// (dimensions, eps, both RoPE spellings incl. YaRN), once here for the draft fields.
// Tensor shapes are then checked by the drafter constructors through WeightStore, whose
// errors name the safetensors file and tensor.
#include "spec/drafter_loader.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "spec/deepspec_drafter.h"
#include "spec/dflash_zlab.h"
#include "spec/draft_vocab.h"
#include "spec/v4_dspark_drafter.h"

namespace dsinfer {

using json = nlohmann::json;

namespace {

std::string ids_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

struct Reader {
  const json& j;
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(file + ": field '" + field + "': " + why);
  }
  // Looks `key` up in `obj` (nested object `sub` when non-empty, falling back to top level).
  const json* find(const std::string& key, const char* sub = nullptr) const {
    if (sub && j.contains(sub) && j.at(sub).is_object() && j.at(sub).contains(key) && !j.at(sub).at(key).is_null())
      return &j.at(sub).at(key);
    if (j.contains(key) && !j.at(key).is_null()) return &j.at(key);
    return nullptr;
  }
  std::string name(const std::string& key, const char* sub) const {
    if (sub && j.contains(sub) && j.at(sub).is_object() && j.at(sub).contains(key)) return std::string(sub) + "." + key;
    return key;
  }
  int64_t integer(const json& v, const std::string& field) const {
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + std::string(v.type_name()));
    return v.get<int64_t>();
  }
  bool boolean(const json& v, const std::string& field) const {
    if (!v.is_boolean()) fail(field, "expected true/false, got " + std::string(v.type_name()));
    return v.get<bool>();
  }
};

}  // namespace

DraftConfig parse_draft_config(const std::string& draft_dir, const ModelConfig& target) {
  const std::string file = draft_dir + "/config.json";
  DraftConfig d;
  d.base = load_model_config(draft_dir);  // throws naming the file/field
  const json j = read_json_file(file);
  Reader r{j, file};
  const ModelConfig& b = d.base;

  // ---- dialect ----------------------------------------------------------------------------
  const std::string arch = b.architecture;
  if (arch == "DFlashDraftModel" || (arch.empty() && j.contains("dflash_config"))) {
    d.dialect = DraftDialect::ZLab;
  } else if (arch == "Qwen3DSparkModel") {
    d.dialect = DraftDialect::DeepSpec;
  } else if (arch == "Gemma4DSparkModel") {
    r.fail("architectures", "Gemma4DSparkModel drafts are not supported (supported: DFlashDraftModel, Qwen3DSparkModel)");
  } else {
    r.fail("architectures", "'" + arch + "' is not a draft model (supported: DFlashDraftModel, Qwen3DSparkModel)");
  }
  const bool zlab = d.dialect == DraftDialect::ZLab;
  const char* sub = zlab ? "dflash_config" : nullptr;

  // ---- backbone vs target -----------------------------------------------------------------
  if (b.hidden_act != "silu") r.fail("hidden_act", "'" + b.hidden_act + "' is not supported (expected silu)");
  if (b.use_sliding_window) r.fail("use_sliding_window", "sliding-window attention is not supported for draft layers");
  if (j.contains("layer_types") && j.at("layer_types").is_array())
    for (const auto& t : j.at("layer_types"))
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        r.fail("layer_types", "only full_attention draft layers are supported, got " + t.dump());
  if (b.hidden_size != target.hidden_size)
    r.fail("hidden_size", std::to_string(b.hidden_size) + " but the target's hidden_size is " + std::to_string(target.hidden_size));
  if (!zlab && b.vocab_size != target.vocab_size)
    r.fail("vocab_size", std::to_string(b.vocab_size) + " but the target's vocab_size is " + std::to_string(target.vocab_size));

  // ---- block size, mask token ---------------------------------------------------------------
  const json* bsj = r.find("block_size", sub);
  if (!bsj) r.fail("block_size", "missing");
  const int64_t bs = r.integer(*bsj, r.name("block_size", sub));
  if (bs < 2 || bs > 4096) r.fail(r.name("block_size", sub), "value " + std::to_string(bs) + " out of range [2, 4096]");
  d.block_size = static_cast<int>(bs);
  const json* mj = r.find("mask_token_id", sub);
  if (!mj) r.fail(zlab ? "dflash_config.mask_token_id" : "mask_token_id", "missing");
  const int64_t mask = r.integer(*mj, r.name("mask_token_id", sub));
  if (mask < 0 || mask >= target.vocab_size)
    r.fail(r.name("mask_token_id", sub),
           std::to_string(mask) + " outside the target vocabulary [0, " + std::to_string(target.vocab_size) + ")");
  d.mask_token_id = static_cast<int32_t>(mask);

  // ---- target layers ------------------------------------------------------------------------
  const int Lt = target.num_hidden_layers;
  if (const json* nt = r.find("num_target_layers", sub)) {
    const int64_t n = r.integer(*nt, r.name("num_target_layers", sub));
    if (n != Lt)
      r.fail(r.name("num_target_layers", sub),
             std::to_string(n) + " but the target has " + std::to_string(Lt) + " layers (draft trained for another target?)");
  }
  const std::string ids_field = r.name("target_layer_ids", sub);
  if (const json* ij = r.find("target_layer_ids", sub)) {
    if (!ij->is_array() || ij->empty()) r.fail(ids_field, "expected a non-empty list of integers");
    for (const auto& v : *ij) d.target_layer_ids.push_back(static_cast<int>(r.integer(v, ids_field)));
  } else if (zlab) {
    d.target_layer_ids = default_target_layer_ids(Lt, b.num_hidden_layers);
  } else {
    r.fail("target_layer_ids", "missing");
  }
  for (size_t i = 0; i < d.target_layer_ids.size(); ++i) {
    const int id = d.target_layer_ids[i];
    if (id < -1 || id >= Lt)
      r.fail(ids_field, ids_str(d.target_layer_ids) + ": id " + std::to_string(id) + " outside {-1} ∪ [0, " +
                            std::to_string(Lt - 1) + "]");
    if (i > 0 && id <= d.target_layer_ids[i - 1]) r.fail(ids_field, ids_str(d.target_layer_ids) + " is not strictly increasing");
  }

  // Our own optional field (other loaders ignore it): the drafter's training context, the
  // default --dflash-window-size.
  if (const json* cw = r.find("dsinfer_context_window")) {
    const int64_t w = r.integer(*cw, "dsinfer_context_window");
    if (w < 0 || w > (int64_t{1} << 24)) r.fail("dsinfer_context_window", "value " + std::to_string(w) + " out of range [0, 16777216]");
    d.context_window = static_cast<int>(w);
  }

  // ---- DeepSpec heads ------------------------------------------------------------------------
  if (!zlab) {
    if (const json* mr = r.find("markov_rank")) {
      const int64_t rank = r.integer(*mr, "markov_rank");
      if (rank < 0 || rank > 65536) r.fail("markov_rank", "value " + std::to_string(rank) + " out of range [0, 65536]");
      d.markov_rank = static_cast<int>(rank);
    }
    if (d.markov_rank > 0) {
      std::string t = "vanilla";
      if (const json* tj = r.find("markov_head_type")) {
        if (!tj->is_string()) r.fail("markov_head_type", "expected a string");
        t = tj->get<std::string>();
        std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
      }
      if (t != "vanilla" && t != "gated" && t != "rnn")
        r.fail("markov_head_type", "'" + t + "' is not one of vanilla, gated, rnn");
      d.markov_head = t;
    }
    if (const json* cj = r.find("enable_confidence_head")) d.confidence_head = r.boolean(*cj, "enable_confidence_head");
    if (d.confidence_head) {
      if (const json* wm = r.find("confidence_head_with_markov"))
        d.confidence_with_markov = r.boolean(*wm, "confidence_head_with_markov") ? 1 : 0;
      if (d.confidence_with_markov == 1 && d.markov_rank == 0)
        r.fail("confidence_head_with_markov", "true but markov_rank is 0 (no Markov embedding to feed the head)");
    }
  }
  return d;
}

namespace {
std::atomic<DeviceDrafterFactory> g_device_factory{nullptr};
}  // namespace

void register_device_drafter_factory(DeviceDrafterFactory factory) { g_device_factory.store(factory); }

namespace {
// opts.draft_vocab_size / draft_vocab_file -> opts.draft_vocab_ids (drafter_loader.h).
void resolve_draft_vocab(const std::string& draft_dir, const Model& target, DrafterOptions& o) {
  o.draft_vocab_ids.clear();
  const int n_asked = o.draft_vocab_size;
  if (n_asked < -1) throw Error("--draft-vocab: must be >= 0 (0 = the whole vocabulary), got " + std::to_string(n_asked));
  // A target on a device keeps the whole vocabulary unless --draft-vocab N asks: the drafter
  // there (or the host drafter borrowing the device's LM head) runs its head as one GEMM, and
  // a ranking's default was chosen for the CPU's costs.
  if (n_asked == 0 || (n_asked < 0 && target.on_device())) return;
  std::string file = o.draft_vocab_file;
  if (!file.empty()) {
    if (!file_exists(file)) throw Error("--draft-vocab-file: " + file + " not found");
  } else {
    for (const std::string& dir : {draft_dir, target.config().model_dir})
      if (!dir.empty() && file_exists(dir + "/draft_vocab.json")) {
        file = dir + "/draft_vocab.json";
        break;
      }
  }
  if (file.empty()) {
    if (n_asked > 0)
      throw Error("--draft-vocab " + std::to_string(n_asked) + ": no ranking (neither " + draft_dir + "/draft_vocab.json nor " +
                  target.config().model_dir + "/draft_vocab.json exists; make one with dsinfer draft-vocab, or pass --draft-vocab-file)");
    return;
  }
  const int V = target.config().vocab_size;
  const DraftVocabRanking r = read_draft_vocab(file, V);
  const int n = n_asked > 0 ? n_asked : r.default_size;
  if (n > V) throw Error("--draft-vocab: " + std::to_string(n) + " exceeds the vocabulary (" + std::to_string(V) + " ids)");
  if (n == 0 || n == V) return;
  o.draft_vocab_ids = draft_vocab_subset(r, n);
}
}  // namespace

std::unique_ptr<Drafter> load_drafter(const std::string& draft_dir, const Model& target, const DrafterOptions& opts) {
  if (opts.window_size < -1)
    throw Error("--dflash-window-size: must be >= 0 (0 = unlimited), got " + std::to_string(opts.window_size));
  // A DeepSeek-V4 checkpoint carries its DSpark drafter as mtp.* stages (config: dspark_*).
  if (is_deepseek_v4_dir(draft_dir)) {
    if (opts.draft_vocab_size > 0 || !opts.draft_vocab_file.empty())
      throw Error("--draft-vocab: not supported by the DeepSeek-V4 DSpark drafter (mtp.*) yet");
    return load_v4_dspark_drafter(draft_dir, target, opts);
  }
  DraftConfig cfg = parse_draft_config(draft_dir, target.config());
  DrafterOptions o = opts;
  if (o.window_size < 0) o.window_size = cfg.context_window;
  resolve_draft_vocab(draft_dir, target, o);
  if (cfg.dialect == DraftDialect::ZLab) {
    if (!o.draft_vocab_ids.empty() && !target.host_lm_head()) {
      throw Error("--draft-vocab: the z-lab drafter borrows the target's LM head, which is not on the host here");
    }
    return std::make_unique<ZlabDFlashDrafter>(cfg, target, o);
  }
  // The device drafter drafts from the whole vocabulary; an explicit --draft-vocab N runs the
  // host drafter instead.
  if (o.on_device && target.on_device() && o.draft_vocab_ids.empty())
    if (DeviceDrafterFactory f = g_device_factory.load())
      if (std::unique_ptr<Drafter> d = f(cfg, target, o)) return d;
  return std::make_unique<DeepSpecDrafter>(cfg, target, o);
}

}  // namespace dsinfer
