// GlooCommunicator: the Communicator over Gloo's TCP transport, for CPU tensors. Built by
// ConnectGloo (collective/rendezvous.h), which meets the other ranks through the rendezvous
// store (collective/gloo_store.h) and connects every pair of ranks.
//
// The algorithms are Gloo's ring all-gather and all-reduce, its binomial-tree broadcast and
// barrier, and a ring reduce-scatter written here on Gloo's point-to-point buffers (Gloo's own
// ReduceScatterHalvingDoubling predates its time-out-aware API and works in place). Every
// call carries a Gloo tag of its own (a counter, equal on every rank) and an end-to-end
// deadline of CommunicatorOptions::timeout.
//
// Errors: a time-out is DeadlineExceeded, a dropped connection Unavailable, a bad argument
// InvalidArgument naming the tensor; after any of them the communicator is poisoned and
// returns that status from every later call without touching Gloo. Every rank must pass
// tensors of the same sizes: a mismatch between ranks is not detected (checking would cost a
// round trip per call) and what follows is undefined.
//
// A process that uses Gloo ignores SIGPIPE (ConnectGloo sets it if it was the default):
// writing to a dead peer must be an error, not the end of the survivor.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "collective/communicator.h"
#include "collective/kv_store.h"

namespace gloo {
class Context;
}

namespace prl::collective {

class GlooCommunicator final : public Communicator {
 public:
  // `context` is fully connected; `store` is kept alive with the communicator (rank 0 serves
  // it to later communicators of the run).
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::shared_ptr<KvStore> store,
                   const CommunicatorOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return Device::Cpu(); }
  std::string backend() const override { return "gloo"; }

  absl::Status AllGather(const Tensor& shard, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& shard) override;
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override;
  absl::Status SendRecv(const Tensor& send, int to, const Tensor& recv, int from) override;
  absl::Status AllReduce(const Tensor& data, ReduceOp op) override;
  absl::Status Broadcast(const Tensor& data, int root) override;
  absl::Status AllReduceHost(absl::Span<double> values, ReduceOp op) override;
  absl::Status BroadcastHost(absl::Span<uint8_t> bytes, int root) override;
  absl::Status Barrier() override;

  // A barrier with its own time-out (ConnectGloo waits for the slowest rank with the
  // rendezvous time-out).
  absl::Status BarrierWithin(absl::Duration timeout);

 private:
  // Runs `body` (which calls Gloo with the tag and deadline it is given) unless poisoned, and
  // turns Gloo's exceptions into the poisoning status.
  absl::Status Run(absl::string_view op, absl::Duration timeout,
                   absl::FunctionRef<void(uint32_t tag, std::chrono::milliseconds timeout)> body);
  // Records `status` as the poisoning error and returns it.
  absl::Status Fail(absl::Status status);
  // InvalidArgument unless `t` is a CPU tensor (of `dtype` when given).
  absl::Status CheckTensor(absl::string_view op, absl::string_view name, const Tensor& t,
                           const DType* dtype);
  void RingReduceScatter(const float* in, float* shard, size_t n, uint32_t tag,
                         std::chrono::milliseconds timeout);
  std::string Where(absl::string_view op) const;  // "collective all_gather on rank 1 of 3"

  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<KvStore> store_;
  CommunicatorOptions options_;
  int rank_;
  int world_size_;
  uint32_t next_tag_ = 0;
  absl::Status poisoned_;
  std::vector<float> recv_scratch_;     // (2, segment) fp32, ReduceScatter's incoming segments
  std::vector<float> partial_scratch_;  // (n) fp32, ReduceScatter's running sum of one chunk
};

}  // namespace prl::collective
