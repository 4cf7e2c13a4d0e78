// dsinfer harness: server modes and the compare loop (see compare.h).
#include "harness/compare.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"
#include "harness/load_client.h"
#include "harness/server_process.h"
#include "spec/v4_dspark_drafter.h"

namespace dsinfer::harness {

std::string find_embedded_models_dir() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("DSINFER_EMBEDDED_DIR"); env && *env) c.push_back(env);
  try {
    std::string exe = self_exe();
    exe = exe.substr(0, exe.find_last_of('/'));
    c.push_back(exe + "/../models/embedded");
    c.push_back(exe + "/../share/dsinfer/models/embedded");
  } catch (const Error&) {
  }
  c.push_back("models/embedded");
  for (const std::string& d : c)
    if (file_exists(d + "/target/config.json")) return d;
  return "";
}

std::vector<ServeMode> modes_for(const CompareOptions& o) {
  std::string model = o.model_path, dspark = o.draft_model_path, dflash = o.dflash_model_path;
  std::vector<std::string> base;
  if (model.empty()) {
    const std::string e = find_embedded_models_dir();
    if (e.empty()) throw Error("--model-path: not given and the embedded models were not found (set DSINFER_EMBEDDED_DIR)");
    model = e + "/target";
    if (dspark.empty() && file_exists(e + "/dspark/config.json")) dspark = e + "/dspark";
    if (dflash.empty() && file_exists(e + "/dflash/config.json")) dflash = e + "/dflash";
  }
  if (!file_exists(model + "/config.json")) throw Error("--model-path: " + model + "/config.json not found");
  // A DeepSeek-V4 checkpoint carries its DSpark drafter (mtp.*): the DSpark modes use it.
  if (dspark.empty() && has_v4_dspark_stages(model)) dspark = model;
  base = {"--model-path", model};
  std::vector<ServeMode> out;
  for (const std::string& m : o.modes) {
    ServeMode sm{m, base};
    if (m == "plain") {
      sm.args.insert(sm.args.end(), {"--spec", "none"});
    } else if (m == "dflash") {
      if (!dflash.empty()) {
        sm.args.insert(sm.args.end(), {"--draft-model-path", dflash, "--spec", "dflash", "--spec-schedule", "fixed"});
      } else if (!dspark.empty()) {
        // The DSpark drafter with DFlash's fixed-length verification.
        sm.args.insert(sm.args.end(), {"--draft-model-path", dspark, "--spec-schedule", "fixed"});
      } else {
        throw Error("--modes dflash: needs --draft-model-path or --dflash-model-path");
      }
    } else if (m == "dflash+dspark" || m == "dspark") {
      if (dspark.empty()) throw Error("--modes " + m + ": needs --draft-model-path (a DSpark drafter)");
      sm.args.insert(sm.args.end(), {"--draft-model-path", dspark, "--enable-dspark"});
    } else {
      throw Error("--modes: expected plain, dflash or dflash+dspark, got '" + m + "'");
    }
    sm.args.insert(sm.args.end(), o.serve_args.begin(), o.serve_args.end());
    out.push_back(std::move(sm));
  }
  return out;
}

CompareReport run_compare(const CompareOptions& o, std::vector<std::string>& errors) {
  const std::vector<ServeMode> modes = modes_for(o);
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) throw Error("--out-dir: cannot create '" + o.out_dir + "': " + ec.message());
  CompareReport rep;
  rep.meta["modes"] = nlohmann::json::object();
  const double hw_threads = std::max(1u, std::thread::hardware_concurrency());
  for (const ServeMode& m : modes) {
    rep.modes.push_back(m.name);
    rep.runs.emplace_back();
    std::string safe = m.name;
    for (char& c : safe)
      if (c == '+') c = '_';
    const std::string log = o.out_dir + "/server-" + safe + ".log";
    std::fprintf(stderr, "bench --compare: starting our server in mode %s (log %s)\n", m.name.c_str(), log.c_str());
    std::unique_ptr<ManagedServer> srv;
    try {
      srv = std::make_unique<ManagedServer>(m.args, log, o.ready_timeout_s, o.bench.http.api_key);
    } catch (const Error& e) {
      errors.push_back(m.name + ": " + e.what());
      rep.meta["modes"][m.name] = {{"error", e.what()}};
      continue;
    }
    rep.meta["modes"][m.name] = {{"command", srv->command_line()}};
    BenchOptions b = o.bench;
    b.url = srv->url();
    b.progress_prefix = m.name;
    try {
      if (b.request.model.empty()) b.request.model = check_server(b.url, b.http);
      double cpu0 = srv->cpu_seconds(), t0 = now_s();
      rep.runs.back() = run_bench(b, [&](LevelReport& l) {
        const double cpu1 = srv->cpu_seconds(), t1 = now_s();
        l.process_peak_rss_bytes = srv->peak_rss_bytes();
        l.process_cpu_utilisation = (cpu1 - cpu0) / ((t1 - t0) * hw_threads);
        cpu0 = cpu1;
        t0 = t1;
      });
    } catch (const Error& e) {
      errors.push_back(m.name + ": " + e.what());
      rep.meta["modes"][m.name]["error"] = e.what();
    }
    const int rc = srv->stop(60);
    if (rc != 0) errors.push_back(m.name + ": server exited with code " + std::to_string(rc) + " after SIGTERM");
  }
  return rep;
}

}  // namespace dsinfer::harness
