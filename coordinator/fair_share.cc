#include "coordinator/fair_share.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace prl::coordinator {

std::string ShareClassOf(const prl::v1::SubmitPromptSetRequest& request) {
  if (request.has_agent()) return absl::StrCat("agent:", request.agent().address());
  if (!request.has_environment()) return "";
  const prl::v1::EnvironmentSpec& e = request.environment();
  return e.address().empty() ? absl::StrCat("builtin:", e.name()) : e.address();
}

FairShare::FairShare(int64_t slots, std::map<std::string, int64_t> held,
                     std::set<std::string> waiting)
    : slots_(slots), held_(std::move(held)), waiting_(std::move(waiting)) {
  std::set<std::string> wanting = waiting_;
  for (const auto& [klass, n] : held_) {
    if (n > 0) wanting.insert(klass);
  }
  const int64_t classes = std::max<int64_t>(1, static_cast<int64_t>(wanting.size()));
  share_ = slots_ > 0 ? (slots_ + classes - 1) / classes : 0;
}

bool FairShare::OtherBelowShareWaits(const std::string& klass) const {
  for (const std::string& w : waiting_) {
    if (w == klass) continue;
    auto it = held_.find(w);
    if ((it == held_.end() ? 0 : it->second) < share_) return true;
  }
  return false;
}

bool FairShare::Blocked(const std::string& klass) const {
  if (slots_ <= 0) return false;
  auto it = held_.find(klass);
  return (it == held_.end() ? 0 : it->second) >= share_ && OtherBelowShareWaits(klass);
}

bool FairShare::MayTake(const std::string& klass) {
  if (Blocked(klass)) return false;
  ++held_[klass];
  return true;
}

std::map<std::string, int64_t> FairShare::ToReclaim() const {
  std::map<std::string, int64_t> out;
  if (slots_ <= 0) return out;
  int64_t used = 0;
  for (const auto& [klass, n] : held_) used += n;
  int64_t deficit = 0;  // what the waiting classes below their share could use
  for (const std::string& w : waiting_) {
    auto it = held_.find(w);
    deficit += std::max<int64_t>(0, share_ - (it == held_.end() ? 0 : it->second));
  }
  int64_t need = deficit - std::max<int64_t>(0, slots_ - used);
  for (const auto& [klass, n] : held_) {
    if (need <= 0) break;
    const int64_t excess = std::min(n - share_, need);
    if (excess <= 0) continue;
    out[klass] = excess;
    need -= excess;
  }
  return out;
}

}  // namespace prl::coordinator
