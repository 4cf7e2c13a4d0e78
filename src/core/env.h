// dsinfer core: the DSINFER_* on/off switches of the environment, read by one rule: unset
// or empty keeps the caller's default, "0" and "1" set it, anything else is a one-line
// Error naming the variable (so a typo never silently runs the other path).
#pragma once
#include <cstdlib>
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

}  // namespace dsinfer
