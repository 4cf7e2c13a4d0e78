// dsinfer core: the DSINFER_* switches and small choices of the environment, read by one
// rule: unset or empty keeps the caller's default, an allowed value sets it, anything else is
// a one-line Error naming the variable (so a typo never silently runs the other path).
#pragma once
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace dsinfer {

inline bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  if (s != "0" && s != "1") throw Error(std::string(name) + " must be 0 or 1, not '" + s + "'");
  return s == "1";
}

// One of a few whole numbers (e.g. a block shape): the Error lists them.
inline int env_choice(const char* name, std::initializer_list<int> allowed, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  std::string list;
  for (int a : allowed) {
    if (s == std::to_string(a)) return a;
    list += (list.empty() ? "" : ", ") + std::to_string(a);
  }
  throw Error(std::string(name) + " must be one of " + list + ", not '" + s + "'");
}

}  // namespace dsinfer
