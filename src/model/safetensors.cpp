// dsinfer model floor: safetensors parsing, validation, shard resolution and writing.
//
// Data flow: bytes → length prefix check → JSON header (duplicate keys rejected while
// parsing, because a JSON library would silently keep one of them) → per-tensor checks →
// overlap check over the sorted offsets → SafetensorsHeader. Nothing here trusts the file:
// every size product is overflow-checked before it is compared with anything.
#include "model/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/json_util.h"

namespace dsinfer {

using json = nlohmann::json;

namespace {

// A header larger than this is certainly not a real checkpoint header (the largest real
// ones, for models with ~100k tensors, are a few MB); rejecting it early keeps a hostile
// length from making us parse gigabytes.
constexpr uint64_t kMaxHeaderLen = 256ull << 20;

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  if (a != 0 && b > UINT64_MAX / a) return true;
  out = a * b;
  return false;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& file) {
  SafetensorsHeader h;
  if (size < 8) throw Error(file + ": truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8)
    throw Error(file + ": header length " + std::to_string(n) + " goes beyond the end of the file (" + std::to_string(size) + " bytes)");
  if (n > kMaxHeaderLen) throw Error(file + ": header length " + std::to_string(n) + " is implausibly large");
  if (n < 2) throw Error(file + ": header length " + std::to_string(n) + " is too small for a JSON object");
  h.header_len = n;
  h.data_begin = 8 + n;
  const uint64_t data_size = size - h.data_begin;

  const char* text = reinterpret_cast<const char*>(data + 8);
  // Duplicate top-level keys: nlohmann keeps the last one; the format forbids them, and a
  // silently shadowed tensor is exactly the kind of corruption we want to report.
  std::set<std::string> seen;
  std::string dup;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1) {
      std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second && dup.empty()) dup = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, text + n, cb);
  } catch (const json::exception& e) {
    throw Error(file + ": invalid JSON header: " + e.what());
  }
  if (!dup.empty()) throw Error(file + ": tensor '" + dup + "': appears twice in the header");
  if (!j.is_object()) throw Error(file + ": header is not a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw Error(file + ": '__metadata__' must be an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw Error(file + ": '__metadata__' entry '" + m.key() + "' must be a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = file + ": tensor '" + name + "'";
    if (name.empty()) throw Error(file + ": a tensor has an empty name");
    if (!v.is_object()) throw Error(what + ": entry is not an object");
    if (!v.contains("dtype") || !v.at("dtype").is_string()) throw Error(what + ": missing or non-string 'dtype'");
    if (!v.contains("shape") || !v.at("shape").is_array()) throw Error(what + ": missing or non-array 'shape'");
    if (!v.contains("data_offsets") || !v.at("data_offsets").is_array() || v.at("data_offsets").size() != 2)
      throw Error(what + ": 'data_offsets' must be an array of two integers");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = dtype_from_safetensors(v.at("dtype").get<std::string>(), what);
    uint64_t numel = 1;
    for (const json& d : v.at("shape")) {
      if (!d.is_number_unsigned()) throw Error(what + ": shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || mul_overflows(numel, dim, numel))
        throw Error(what + ": shape " + v.at("shape").dump() + " overflows");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    if (t.shape.size() > 8) throw Error(what + ": rank " + std::to_string(t.shape.size()) + " exceeds 8");
    uint64_t nbytes = 0;
    if (mul_overflows(numel, dtype_size(t.dtype), nbytes)) throw Error(what + ": byte size of shape " + shape_str(t.shape) + " overflows");
    const json& off = v.at("data_offsets");
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(what + ": 'data_offsets' must be non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) throw Error(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] has begin > end");
    if (e > data_size)
      throw Error(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] outside the data region (" +
                  std::to_string(data_size) + " bytes)");
    if (e - b != nbytes)
      throw Error(what + ": data_offsets span " + std::to_string(e - b) + " bytes but shape " + shape_str(t.shape) + " of " +
                  dtype_name(t.dtype) + " needs " + std::to_string(nbytes));
    t.begin = h.data_begin + b;
    t.nbytes = nbytes;
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const auto& p = h.tensors[i - 1];
    const auto& c = h.tensors[i];
    // Empty tensors occupy no bytes and may share an offset with anything.
    if (p.nbytes && c.nbytes && c.begin < p.begin + p.nbytes)
      throw Error(file + ": tensor '" + c.name + "': data overlaps tensor '" + p.name + "'");
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path, MappedFile::Placement placement) : file_(path, placement) {
  header_ = parse_safetensors_header(file_.data(), file_.size(), path);
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open_dir(const std::string& dir, MappedFile::Placement placement) {
  auto set = std::make_unique<SafetensorsSet>();
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  auto add_file = [&](const std::string& path) -> SafetensorsFile* {
    set->files_.push_back(std::make_unique<SafetensorsFile>(path, placement));
    SafetensorsFile* f = set->files_.back().get();
    for (const auto& t : f->header().tensors) {
      auto [it, fresh] = set->by_name_.emplace(t.name, TensorLocation{f, &t});
      if (!fresh) throw Error(path + ": tensor '" + t.name + "': also present in " + it->second.file->path());
    }
    return f;
  };
  if (file_exists(index)) {
    json j = read_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
      throw Error(index + ": field 'weight_map': missing or not an object");
    std::map<std::string, std::string> wm;
    std::set<std::string> shards;
    for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
      if (!it.value().is_string()) throw Error(index + ": weight_map entry '" + it.key() + "': expected a file name");
      std::string shard = it.value().get<std::string>();
      // Shards must sit next to the index: no directories, no parent references.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw Error(index + ": weight_map entry '" + it.key() + "': invalid shard file name '" + shard + "'");
      wm[it.key()] = shard;
      shards.insert(shard);
    }
    for (const auto& s : shards) {
      const std::string path = dir + "/" + s;
      if (!file_exists(path)) throw Error(index + ": shard '" + s + "' not found (" + path + ")");
      add_file(path);
    }
    for (const auto& [name, shard] : wm) {
      const TensorLocation* loc = set->find(name);
      if (!loc || loc->file->path() != dir + "/" + shard)
        throw Error(index + ": tensor '" + name + "': listed in shard '" + shard + "' but not found there");
    }
  } else if (file_exists(single)) {
    add_file(single);
  } else {
    throw Error(dir + ": no model.safetensors or model.safetensors.index.json found");
  }
  return set;
}

const TensorLocation* SafetensorsSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       const std::map<std::string, std::string>& metadata) {
  json hdr = json::object();
  if (!metadata.empty()) hdr["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<uint64_t> sizes;
  for (const auto& it : items) {
    uint64_t n = dtype_size(it.dtype);
    for (int64_t d : it.shape) n *= static_cast<uint64_t>(d);
    hdr[it.name] = {{"dtype", dtype_name(it.dtype)}, {"shape", it.shape}, {"data_offsets", {off, off + n}}};
    sizes.push_back(n);
    off += n;
  }
  std::string text = hdr.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create");
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) {
      std::fclose(f);
      throw Error(path + ": write failed");
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  put(len, 8);
  put(text.data(), text.size());
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].data) {
      put(items[i].data, sizes[i]);
    } else if (items[i].fill) {
      buf.resize(sizes[i]);
      items[i].fill(buf.data());
      put(buf.data(), sizes[i]);
    } else {
      std::fclose(f);
      throw Error(path + ": tensor '" + items[i].name + "': no data to write");
    }
  }
  if (std::fclose(f) != 0) throw Error(path + ": write failed");
}

}  // namespace dsinfer
