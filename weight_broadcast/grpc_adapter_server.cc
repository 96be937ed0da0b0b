#include "weight_broadcast/grpc_adapter_server.h"

#include <chrono>
#include <utility>

#include "core/status_macros.h"
#include "weight_broadcast/grpc_channel.h"

namespace prl {

using weight_broadcast_internal::GrpcWeightChannel;
using weight_broadcast_internal::GrpcWeightService;

namespace {

// One adapter's publisher: its channel, served while the publisher lives.
class AdapterChannelPublisher final : public WeightPublisher {
 public:
  AdapterChannelPublisher(GrpcWeightService* service, std::string adapter_id,
                          std::shared_ptr<GrpcWeightChannel> channel)
      : service_(service), adapter_id_(std::move(adapter_id)), channel_(std::move(channel)) {}
  ~AdapterChannelPublisher() override { service_->Detach(adapter_id_, channel_.get()); }

  absl::Status PublishWeights(int64_t version, const WeightView& weights) override {
    return channel_->Publish(version, weights);
  }
  int64_t newest_version() const override { return channel_->newest_version(); }
  PublisherStats stats() const override { return channel_->stats(); }

 private:
  GrpcWeightService* const service_;
  const std::string adapter_id_;
  const std::shared_ptr<GrpcWeightChannel> channel_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcAdapterWeightServer>> GrpcAdapterWeightServer::Start(
    const GrpcPublisherOptions& options) {
  auto server = std::unique_ptr<GrpcAdapterWeightServer>(new GrpcAdapterWeightServer());
  server->options_ = options;
  server->service_ = std::make_unique<GrpcWeightService>();
  PRL_ASSIGN_OR_RETURN(server->server_, weight_broadcast_internal::StartWeightServer(
                                            server->service_.get(), options, &server->port_));
  return server;
}

GrpcAdapterWeightServer::~GrpcAdapterWeightServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<WeightPublisher>> GrpcAdapterWeightServer::Add(
    const std::string& adapter_id, const WeightSpec& spec, const std::string& version_file) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  auto channel = std::make_shared<GrpcWeightChannel>(spec, options_, version_file);
  PRL_RETURN_IF_ERROR(channel->LoadHeldVersion());
  service_->Add(adapter_id, channel);
  return std::make_unique<AdapterChannelPublisher>(service_.get(), adapter_id, std::move(channel));
}

void GrpcAdapterWeightServer::Remove(const std::string& adapter_id) {
  service_->Remove(adapter_id);
}

void GrpcAdapterWeightServer::Shutdown() {
  if (server_ == nullptr) return;
  service_->StopAll();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
}

}  // namespace prl
