#include "actor/adapter_channels.h"

#include "absl/strings/str_cat.h"

namespace prl::actor {

namespace {

absl::Status NotOpen(const std::string& adapter_id) {
  return absl::NotFoundError(absl::StrCat("adapter ", adapter_id, " has no open channel"));
}

}  // namespace

absl::Status AdapterChannels::Open(const prl::v1::LeasedAdapter& adapter) {
  if (Find(adapter.adapter_id()) != nullptr) return absl::OkStatus();
  // Opened without the mutex (it may wait on the segments); a racing open of the same adapter
  // keeps the first.
  absl::StatusOr<Channel> opened = open_(adapter);
  if (!opened.ok()) return opened.status();
  std::lock_guard<std::mutex> lock(mu_);
  channels_.try_emplace(adapter.adapter_id(), std::make_shared<Channel>(*std::move(opened)));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<VersionedWeights>> AdapterChannels::TakeNewer(
    const std::string& adapter_id, int64_t have) {
  std::shared_ptr<Channel> channel = Find(adapter_id);
  if (channel == nullptr) return NotOpen(adapter_id);
  return channel->weights->TakeNewer(have);
}

absl::Status AdapterChannels::Write(const std::string& adapter_id,
                                    absl::Span<const RolloutRecord> group) {
  std::shared_ptr<Channel> channel = Find(adapter_id);
  if (channel == nullptr) return NotOpen(adapter_id);
  return channel->write_group(group);
}

void AdapterChannels::Close(const std::string& adapter_id) {
  std::lock_guard<std::mutex> lock(mu_);
  channels_.erase(adapter_id);
}

std::vector<std::string> AdapterChannels::Gone() const {
  std::vector<std::pair<std::string, std::shared_ptr<Channel>>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open.assign(channels_.begin(), channels_.end());
  }
  std::vector<std::string> gone;
  for (const auto& [id, channel] : open) {
    if (channel->gone && channel->gone()) gone.push_back(id);
  }
  return gone;
}

std::vector<std::string> AdapterChannels::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, channel] : channels_) out.push_back(id);
  return out;
}

std::shared_ptr<AdapterChannels::Channel> AdapterChannels::Find(
    const std::string& adapter_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(adapter_id);
  return it == channels_.end() ? nullptr : it->second;
}

}  // namespace prl::actor
