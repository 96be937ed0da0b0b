#include "env/episode_protocol.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace prl::env {

namespace {

absl::Status Invalid(const std::string& field, const std::string& expected,
                     const std::string& found) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80             ? 1
                       : (c >> 5) == 0x6    ? 2
                       : (c >> 4) == 0xE    ? 3
                       : (c >> 3) == 0x1E   ? 4
                                            : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

absl::Status ValidateMessages(const std::string& field,
                              const google::protobuf::RepeatedPtrField<v1::EnvMessage>& messages) {
  if (messages.size() > kMaxMessages) {
    return Invalid(field, absl::StrCat("at most ", kMaxMessages, " messages"),
                   absl::StrCat(messages.size()));
  }
  for (int i = 0; i < messages.size(); ++i) {
    const v1::EnvMessage& m = messages[i];
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (m.role() != "user" && m.role() != "tool" && m.role() != "system") {
      return Invalid(at + ".role", "\"user\", \"tool\" or \"system\"",
                     absl::StrCat("\"", m.role().substr(0, 32), "\""));
    }
    if (m.content().size() > kMaxMessageBytes) {
      return Invalid(at + ".content", absl::StrCat("at most ", kMaxMessageBytes, " bytes"),
                     absl::StrCat(m.content().size(), " bytes"));
    }
    if (!ValidUtf8(m.content())) return Invalid(at + ".content", "valid UTF-8", "invalid bytes");
    if (!ValidUtf8(m.name())) return Invalid(at + ".name", "valid UTF-8", "invalid bytes");
    if (m.tool_call_id().size() > 256 || !ValidUtf8(m.tool_call_id())) {
      return Invalid(at + ".tool_call_id", "at most 256 bytes of UTF-8",
                     absl::StrCat(m.tool_call_id().size(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStartResponse(const v1::StartEpisodeResponse& r) {
  if (absl::Status s = ValidateMessages("StartEpisodeResponse.observation", r.observation());
      !s.ok()) {
    return s;
  }
  if (r.tools_json().size() > kMaxToolsBytes || !ValidUtf8(r.tools_json())) {
    return Invalid("StartEpisodeResponse.tools_json",
                   absl::StrCat("at most ", kMaxToolsBytes, " bytes of UTF-8"),
                   absl::StrCat(r.tools_json().size(), " bytes"));
  }
  if (r.stop_strings_size() > kMaxStopStrings) {
    return Invalid("StartEpisodeResponse.stop_strings",
                   absl::StrCat("at most ", kMaxStopStrings), absl::StrCat(r.stop_strings_size()));
  }
  for (int i = 0; i < r.stop_strings_size(); ++i) {
    const std::string& stop = r.stop_strings(i);
    if (stop.empty() || stop.size() > kMaxStopStringBytes || !ValidUtf8(stop)) {
      return Invalid(absl::StrCat("StartEpisodeResponse.stop_strings[", i, "]"),
                     absl::StrCat("1 to ", kMaxStopStringBytes, " bytes of UTF-8"),
                     absl::StrCat(stop.size(), " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateStepResponse(const v1::StepResponse& r) {
  if (absl::Status s = ValidateMessages("StepResponse.messages", r.messages()); !s.ok()) return s;
  if (!std::isfinite(r.turn_reward())) {
    return Invalid("StepResponse.turn_reward", "a finite number", absl::StrCat(r.turn_reward()));
  }
  if (r.done() && !std::isfinite(r.episode_reward())) {
    return Invalid("StepResponse.episode_reward", "a finite number when done",
                   absl::StrCat(r.episode_reward()));
  }
  return absl::OkStatus();
}

absl::Status ValidateEndResponse(const v1::EndEpisodeResponse& r) {
  if (!std::isfinite(r.episode_reward())) {
    return Invalid("EndEpisodeResponse.episode_reward", "a finite number",
                   absl::StrCat(r.episode_reward()));
  }
  return absl::OkStatus();
}

}  // namespace prl::env
