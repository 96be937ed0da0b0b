// absl::Status plumbing used everywhere: early return on error, assign-or-return.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define PRL_STATUS_CONCAT_INNER(a, b) a##b
#define PRL_STATUS_CONCAT(a, b) PRL_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the caller if it is not OK.
#define PRL_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status prl_status_ = (expr);       \
    if (!prl_status_.ok()) return prl_status_; \
  } while (0)

// PRL_ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error returns
// its status, otherwise moves the value into `lhs` (which may be a declaration).
#define PRL_ASSIGN_OR_RETURN(lhs, expr) \
  PRL_ASSIGN_OR_RETURN_IMPL(PRL_STATUS_CONCAT(prl_statusor_, __LINE__), lhs, expr)
#define PRL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

namespace prl {

// `status` with "context: " before its message (the same code): e.g. the config key whose
// listener did not start. OK stays OK.
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace prl

// PRL_ASSIGN_OR_RETURN_IN(lhs, expr, context): PRL_ASSIGN_OR_RETURN with the error prefixed by
// `context` (WithContext).
#define PRL_ASSIGN_OR_RETURN_IN(lhs, expr, context) \
  PRL_ASSIGN_OR_RETURN_IN_IMPL(PRL_STATUS_CONCAT(prl_statusor_, __LINE__), lhs, expr, context)
#define PRL_ASSIGN_OR_RETURN_IN_IMPL(tmp, lhs, expr, context)                 \
  auto tmp = (expr);                                                          \
  if (!tmp.ok()) return ::prl::WithContext(std::move(tmp).status(), context); \
  lhs = std::move(tmp).value()
