#include "episode/stop_strings.h"

#include <algorithm>

namespace prl::episode {

StopStrings::StopStrings(std::shared_ptr<const tokenizer::TextCodec> codec,
                         std::vector<std::string> stops)
    : codec_(std::move(codec)), stops_(std::move(stops)) {
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

bool StopStrings::CompletedBy(absl::Span<const int32_t> turn) const {
  if (turn.empty() || stops_.empty()) return false;
  const auto contains_stop = [&](const std::string& text) {
    return std::any_of(stops_.begin(), stops_.end(),
                       [&](const std::string& s) { return text.find(s) != std::string::npos; });
  };
  // Widen the window until the text before the newest token holds the longest stop string (or
  // the window is the whole turn): then one the newest token completes is inside `with`.
  size_t window = std::min<size_t>(turn.size(), 8);
  std::string before, with;
  for (;;) {
    const absl::Span<const int32_t> tail = turn.subspan(turn.size() - window);
    absl::StatusOr<std::string> b = codec_->DecodeCompletion(tail.first(window - 1));
    absl::StatusOr<std::string> w = codec_->DecodeCompletion(tail);
    if (!b.ok() || !w.ok()) return false;  // ids the codec cannot decode: no text to match
    before = *std::move(b);
    with = *std::move(w);
    if (before.size() >= longest_ || window == turn.size()) break;
    window = std::min(turn.size(), window * 2);
  }
  return contains_stop(with) && !contains_stop(before);
}

}  // namespace prl::episode
