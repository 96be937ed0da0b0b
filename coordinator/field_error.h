// The coordinator's error for a bad request field: InvalidArgument reading
// "<field>: expected <expected>, found <found>".
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace prl::coordinator {

inline absl::Status Invalid(absl::string_view field, absl::string_view expected,
                            absl::string_view found) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

}  // namespace prl::coordinator
