#include "learner/step_samples.h"

#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "replay/record_decoder.h"
#include "replay/record_encoder.h"

namespace prl::learner {

namespace {

constexpr char kMagic[8] = {'P', 'R', 'L', 'S', 'T', 'E', 'P', '1'};
constexpr uint64_t kStopCount = std::numeric_limits<uint64_t>::max();
constexpr char kAdvantage[] = "advantage";

void PutU64(uint64_t v, std::vector<uint8_t>* out) {  // little-endian hosts (x86, arm64)
  const size_t at = out->size();
  out->resize(at + sizeof(v));
  std::memcpy(out->data() + at, &v, sizeof(v));
}

std::vector<uint8_t> WithMagic() {
  std::vector<uint8_t> out(sizeof(kMagic));
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  return out;
}

absl::Status Damaged(const std::string& what) {
  return absl::DataLossError(absl::StrCat("step samples: ", what));
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> EncodeStepSamples(absl::Span<const TrainSample> samples) {
  std::vector<uint8_t> out = WithMagic();
  PutU64(samples.size(), &out);
  for (size_t i = 0; i < samples.size(); ++i) {
    const TrainSample& s = samples[i];
    if (!s.has_advantage) {
      return absl::InvalidArgumentError(
          absl::StrCat("step samples: sample ", i, ": expected an advantage, found none"));
    }
    RolloutRecord r;
    r.prompt_tokens = s.prompt;
    r.completion_tokens = s.completion;
    r.behaviour_logprobs = s.behaviour_logprobs;
    r.token_versions = s.versions;
    r.token_sources = s.sources;
    r.route_layers = s.route_layers;
    r.route_top_k = s.route_top_k;
    r.routes = s.routes;
    r.reward = s.reward;
    r.reward_components = {{kAdvantage, s.advantage}};
    if (absl::Status valid = ValidateRecord(r); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step samples: sample ", i, ": ", valid.message()));
    }
    const size_t size = EncodedRecordSize(r);
    PutU64(size, &out);
    const size_t at = out.size();
    out.resize(at + size);
    EncodeRecordTo(r, out.data() + at);
  }
  return out;
}

std::vector<uint8_t> EncodeStopSignal() {
  std::vector<uint8_t> out = WithMagic();
  PutU64(kStopCount, &out);
  return out;
}

absl::StatusOr<std::optional<std::vector<TrainSample>>> DecodeStepSamples(
    absl::Span<const uint8_t> bytes) {
  size_t at = 0;
  const auto u64 = [&](uint64_t* v) {
    if (bytes.size() - at < sizeof(*v)) return false;
    std::memcpy(v, bytes.data() + at, sizeof(*v));
    at += sizeof(*v);
    return true;
  };
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Damaged("expected the magic PRLSTEP1 (bytes of another format or version)");
  }
  at = sizeof(kMagic);
  uint64_t count = 0;
  if (!u64(&count)) return Damaged("cut off before the sample count");
  if (count == kStopCount) {
    if (at != bytes.size()) return Damaged("trailing bytes after the stop signal");
    return std::nullopt;
  }
  // Each sample takes at least its length word: a count beyond that is damage, not a reason to
  // allocate.
  if (count > (bytes.size() - at) / sizeof(uint64_t)) {
    return Damaged(absl::StrCat("a count of ", count, " samples in ", bytes.size(), " bytes"));
  }
  std::vector<TrainSample> samples(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t size = 0;
    if (!u64(&size) || size > bytes.size() - at) {
      return Damaged(absl::StrCat("sample ", i, ": cut off (", bytes.size() - at, " bytes left)"));
    }
    absl::StatusOr<RolloutRecord> r = DecodeRecord(bytes.subspan(at, size));
    if (!r.ok()) return Damaged(absl::StrCat("sample ", i, ": ", r.status().message()));
    at += size;
    if (r->reward_components.size() != 1 || r->reward_components[0].first != kAdvantage) {
      return Damaged(absl::StrCat("sample ", i, ": expected the reward component 'advantage'"));
    }
    TrainSample& s = samples[i];
    s.prompt = std::move(r->prompt_tokens);
    s.completion = std::move(r->completion_tokens);
    s.behaviour_logprobs = std::move(r->behaviour_logprobs);
    s.versions = std::move(r->token_versions);
    s.sources = std::move(r->token_sources);
    s.route_layers = r->route_layers;
    s.route_top_k = r->route_top_k;
    s.routes = std::move(r->routes);
    s.reward = r->reward;
    s.advantage = r->reward_components[0].second;
    s.has_advantage = true;
  }
  if (at != bytes.size()) return Damaged(absl::StrCat(bytes.size() - at, " trailing bytes"));
  return samples;
}

}  // namespace prl::learner
