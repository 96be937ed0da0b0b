// Enumerations that users spell (config values, flags). Each enum has one table of its
// accepted spellings next to its declaration, and ParseEnum / EnumName are the only
// conversions: a misspelling is always an error that names the field and lists every accepted
// value (`learner.advantage: expected one of grpo, dr_grpo; found 'grpoo'`).
//
//   inline constexpr NamedValue<OptimizerKind> kOptimizerKindNames[] = {
//       {"adamw", OptimizerKind::kAdamW}, {"sgd", OptimizerKind::kSgd}};
//   PRL_ASSIGN_OR_RETURN(OptimizerKind kind, ParseEnum(kOptimizerKindNames, text, "--optimizer"));
//
// The first entry for a value is its canonical name (the one EnumName returns and configs
// print); later entries for the same value are accepted aliases.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace prl {

template <typename E>
struct NamedValue {
  absl::string_view name;
  E value;
};

// "a, b, c": every accepted spelling, in table order.
template <typename E>
std::string EnumNameList(absl::Span<const NamedValue<E>> names,
                         absl::string_view separator = ", ") {
  return absl::StrJoin(names, separator, [](std::string* out, const NamedValue<E>& n) {
    out->append(n.name.data(), n.name.size());
  });
}

template <typename E>
absl::StatusOr<E> ParseEnum(absl::Span<const NamedValue<E>> names, absl::string_view text,
                            absl::string_view field) {
  for (const NamedValue<E>& n : names) {
    if (n.name == text) return n.value;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected one of ", EnumNameList(names), "; found '", text, "'"));
}

// The canonical name of `value` ("?" for a value missing from the table: a programming error
// that tests of each table catch).
template <typename E>
absl::string_view EnumName(absl::Span<const NamedValue<E>> names, E value) {
  for (const NamedValue<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return "?";
}

// Tables are C arrays; these deduce E from them.
template <typename E, size_t N>
std::string EnumNameList(const NamedValue<E> (&names)[N], absl::string_view separator = ", ") {
  return EnumNameList<E>(absl::MakeConstSpan(names), separator);
}
template <typename E, size_t N>
absl::StatusOr<E> ParseEnum(const NamedValue<E> (&names)[N], absl::string_view text,
                            absl::string_view field) {
  return ParseEnum<E>(absl::MakeConstSpan(names), text, field);
}
template <typename E, size_t N>
absl::string_view EnumName(const NamedValue<E> (&names)[N], E value) {
  return EnumName<E>(absl::MakeConstSpan(names), value);
}

}  // namespace prl
