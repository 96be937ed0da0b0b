// Precondition checks for programmer errors (llama.cpp style asserts, always on).
//
// User input is validated at module boundaries and reported as absl::Status; a failed
// PRL_CHECK means a caller broke a documented precondition, so it prints file, line and the
// message and aborts. Kernels use these because their preconditions (shapes, devices) are
// established by validated callers.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace prl::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* cond,
                                     const std::string& message) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, cond, message.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace prl::internal

// PRL_CHECK(cond, message parts...): the parts are concatenated with absl::StrCat.
#define PRL_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      ::prl::internal::CheckFailed(__FILE__, __LINE__, #cond, absl::StrCat(__VA_ARGS__)); \
    }                                                                                     \
  } while (0)
