// Test helper shared by the test files that check refusals: the message of the
// dsinfer::Error a call throws ("" when it throws none), so a test can assert what it names.
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace dsinfer::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dsinfer::test
