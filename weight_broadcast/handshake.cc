#include "weight_broadcast/handshake.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"
#include "model/parameters.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {

namespace {
constexpr absl::string_view kHandshakeTag = "prl-weights-v1";
}  // namespace

WeightHandshake LocalHandshake(absl::string_view transport, const WeightSpec& spec,
                               absl::string_view data_path) {
  WeightHandshake h;
  h.transport = std::string(transport);
  h.model_fingerprint = WeightFingerprint(spec);
  h.weight_bytes = WeightBytes(spec);
  h.data_path = std::string(data_path);
  return h;
}

absl::Status CheckHandshake(const WeightHandshake& published, const WeightHandshake& local,
                            absl::string_view where) {
  if (published.transport != local.transport) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the publisher sends weights over '", published.transport,
        "' but this process expects '", local.transport, "' (both must use the same transport)"));
  }
  PRL_RETURN_IF_ERROR(CheckSameModel(published.model_fingerprint, local.model_fingerprint, where));
  if (published.weight_bytes != local.weight_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the publisher's versions are ", published.weight_bytes, " bytes, this model has ",
        local.weight_bytes,
        " (the same config.json but another parameter layout: a different prl version?)"));
  }
  if (published.data_path != local.data_path) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the publisher sends weights with ", published.data_path,
                     " but this process would receive them with ", local.data_path,
                     " (publisher and subscribers must all use CUDA devices, or all the CPU)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPublishedWeights(const WeightHandshake& publisher, const WeightView& weights,
                                   absl::string_view where) {
  PRL_RETURN_IF_ERROR(CheckSameModel(publisher.model_fingerprint, weights.fingerprint, where));
  if (static_cast<int64_t>(weights.bytes) != publisher.weight_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": weights buffer must be ",
                                                   publisher.weight_bytes, " bytes, found ",
                                                   weights.bytes));
  }
  return absl::OkStatus();
}

std::string EncodeHandshake(const WeightHandshake& h) {
  return absl::StrCat(kHandshakeTag, "\ntransport=", h.transport, "\nweight_bytes=", h.weight_bytes,
                      "\ndata_path=", h.data_path, "\nfingerprint=", h.model_fingerprint);
}

absl::StatusOr<WeightHandshake> DecodeHandshake(absl::string_view text, absl::string_view where) {
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(where, ": unreadable weight handshake (", what, "): '",
                                            text.substr(0, 200), "'"));
  };
  if (lines.size() != 5 || lines[0] != kHandshakeTag) {
    return bad(absl::StrCat("expected 5 lines starting with ", kHandshakeTag));
  }
  WeightHandshake h;
  const absl::string_view keys[] = {"transport=", "weight_bytes=", "data_path=", "fingerprint="};
  absl::string_view values[4];
  for (int i = 0; i < 4; ++i) {
    if (!absl::ConsumePrefix(&(values[i] = lines[i + 1]), keys[i])) {
      return bad(absl::StrCat("line ", i + 2, " should start with ", keys[i]));
    }
  }
  h.transport = std::string(values[0]);
  if (!absl::SimpleAtoi(values[1], &h.weight_bytes)) return bad("weight_bytes is not a number");
  h.data_path = std::string(values[2]);
  h.model_fingerprint = std::string(values[3]);
  return h;
}

}  // namespace prl
