// Checking error statuses in tests: the code, and that the message names what went wrong.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace prl::testing {

// Succeeds when `status` has `code` and its message contains every one of `parts`; the
// failure message shows the whole status.
inline ::testing::AssertionResult IsError(const absl::Status& status, absl::StatusCode code,
                                          std::initializer_list<absl::string_view> parts) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected code " << absl::StatusCodeToString(code) << ", got " << status;
  }
  for (absl::string_view part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure()
             << "message does not contain '" << part << "': " << status;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace prl::testing
