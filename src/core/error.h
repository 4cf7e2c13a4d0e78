// dsinfer core: the one exception type the library throws for bad input.
// Every message is a single line that names the file, field or parameter at fault, so the
// CLI can print it as-is and exit non-zero, and the server can turn it into an HTTP 4xx.
#pragma once
#include <stdexcept>
#include <string>

namespace dsinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throws dsinfer::Error(msg) when cond is false. Use for input validation, not for bugs.
inline void check(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

}  // namespace dsinfer
