// The context-parallel group's collectives (model/context_parallel.h's ContextExchange) over a
// communicator of the group's ranks (roles/learner_rank.h connects one per group: ranks
// [g C, (g + 1) C) of the learner, over Gloo). Not owned: the communicator outlives it.
#pragma once

#include "collective/communicator.h"
#include "model/context_parallel.h"

namespace prl::learner {

class CommunicatorExchange final : public ContextExchange {
 public:
  explicit CommunicatorExchange(collective::Communicator* comm) : comm_(comm) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->world_size(); }
  absl::Status AllGather(const Tensor& shard, const Tensor& out) override {
    return comm_->AllGather(shard, out);
  }
  absl::Status ReduceScatter(const Tensor& in, const Tensor& shard) override {
    return comm_->ReduceScatter(in, shard);
  }
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override {
    return comm_->AllToAll(in, out);
  }
  absl::Status Shift(const Tensor& send, const Tensor& recv) override {
    const int n = comm_->world_size(), r = comm_->rank();
    return comm_->SendRecv(send, (r + 1) % n, recv, (r + n - 1) % n);
  }
  absl::Status AllReduceHost(absl::Span<double> values) override {
    return comm_->AllReduceHost(values, collective::ReduceOp::kSum);
  }

 private:
  collective::Communicator* comm_;
};

}  // namespace prl::learner
