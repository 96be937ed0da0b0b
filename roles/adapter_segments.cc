#include "roles/adapter_segments.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "replay/replay_buffer.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::roles {

std::string AdapterWeightSegment(const config::RunConfig& config, const std::string& adapter_id) {
  return absl::StrCat(config.weight_segment(), "-", adapter_id);
}

std::string AdapterReplaySegment(const config::RunConfig& config, const std::string& adapter_id) {
  return absl::StrCat(config.replay_segment(), "-", adapter_id);
}

bool IsAdapterId(std::string_view id) {
  if (id.size() != 15 || !id.starts_with("ad-")) return false;
  return std::all_of(id.begin() + 3, id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

void RemoveAdapterSegments(const config::RunConfig& config, const std::set<std::string>& keep) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    for (const std::string& segment : {config.weight_segment(), config.replay_segment()}) {
      if (!name.starts_with(segment + "-")) continue;
      const std::string id = name.substr(segment.size() + 1);
      if (!IsAdapterId(id) || keep.contains(id)) continue;
      if (segment == config.weight_segment()) {
        RemoveShmWeightSegment(name).IgnoreError();
      } else {
        ReplayBuffer::Remove(name, /*force=*/true).IgnoreError();
      }
    }
  }
}

std::string AdapterReportFile(const config::RunConfig& config, const std::string& adapter_name) {
  std::string stem = config.learner.report_file;
  if (stem.ends_with(".jsonl")) stem.resize(stem.size() - 6);
  return absl::StrCat(stem, ".", adapter_name, ".jsonl");
}

LoraConfig LoraConfigOf(const prl::v1::AdapterSpec& spec) {
  LoraConfig lora;
  lora.rank = spec.rank();
  lora.alpha = spec.alpha();
  lora.rslora = spec.rslora();
  lora.target_modules.assign(spec.target_modules().begin(), spec.target_modules().end());
  return lora;
}

actor::AdapterChannels::Opener AdapterChannelOpener(const config::RunConfig& config,
                                                    const ModelConfig& model) {
  return [config, model](const prl::v1::LeasedAdapter& adapter)
             -> absl::StatusOr<actor::AdapterChannels::Channel> {
    const std::string& id = adapter.adapter_id();
    const auto not_yet = [&](const absl::Status& s) {
      return absl::IsNotFound(s) || absl::IsUnavailable(s)
                 ? absl::NotFoundError(absl::StrCat("adapter ", id, ": not made yet (", s.message(),
                                                    ")"))
                 : s;
    };
    const WeightSpec spec(model, LoraConfigOf(adapter.spec()));
    const absl::Duration timeout = absl::Seconds(config.actors.replay_timeout_s);
    actor::AdapterChannels::Channel channel;
    if (config.broadcast.transport == config::WeightTransport::kGrpc) {
      // Across nodes: a stream of the adapter's versions from the weight server of the learner
      // rank it is placed on ({rank} in broadcast.address), which waits (retried) until the
      // learner makes the adapter; a deleted adapter's fails NotFound.
      GrpcSubscriberOptions options;
      options.adapter_id = id;
      PRL_ASSIGN_OR_RETURN(
          std::unique_ptr<GrpcWeightSubscriber> weights,
          GrpcWeightSubscriber::Connect(
              config::AtLearnerRank(config.weights_address(), adapter.learner_rank()), spec,
              options));
      channel.gone = [subscriber = weights.get()] {
        return absl::IsNotFound(subscriber->TakeNewer(std::numeric_limits<int64_t>::max()).status());
      };
      channel.weights = std::move(weights);
    } else {
      absl::StatusOr<std::unique_ptr<ShmWeightSubscriber>> weights =
          ShmWeightSubscriber::Open(AdapterWeightSegment(config, id), spec, {});
      if (!weights.ok()) return not_yet(weights.status());
      channel.weights = *std::move(weights);
      // The learner removes the segments when the adapter is deleted (POSIX shared memory lives
      // in /dev/shm): the actor then closes its channel.
      channel.gone = [path = std::filesystem::path("/dev/shm") / AdapterWeightSegment(config, id)] {
        std::error_code error;
        return !std::filesystem::exists(path, error) && !error;
      };
    }
    if (!config.replay.address.empty()) {  // its rank's remote ingest, into the adapter's replay
      PRL_ASSIGN_OR_RETURN(channel.write_group,
                           actor::RemoteReplayWriter(
                               config::AtLearnerRank(config.replay.address, adapter.learner_rank()),
                               timeout, config.replay.max_message_mb << 20, id));
      return channel;
    }
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> replay =
        ReplayBuffer::Open(AdapterReplaySegment(config, id));
    if (!replay.ok()) return not_yet(replay.status());
    std::shared_ptr<ReplayBuffer> buffer = *std::move(replay);
    channel.write_group = [buffer, write = actor::LocalReplayWriter(buffer.get(), timeout)](
                              absl::Span<const RolloutRecord> group) { return write(group); };
    return channel;
  };
}

}  // namespace prl::roles
