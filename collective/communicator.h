// Communicator: the collectives a learner rank needs (FSDP's all-gather and reduce-scatter,
// statistics all-reduce, broadcast, barrier), one interface over every backend: Gloo (TCP,
// CPU tensors) and NCCL (CUDA tensors).
//
// Every rank calls the same collectives in the same order. Every call has a time-out
// (CommunicatorOptions::timeout): a peer that died or hangs turns into DeadlineExceeded (or
// Unavailable when its connection dropped) naming the collective and this rank, never a hang.
// After an error the communicator is unusable: every later call fails at once with the same
// status (a rank that lost a peer must exit and be restarted with its group).
//
// Thread-safety: calls on one Communicator must not overlap; FSDP runs them all on its one
// communication thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/tensor.h"

namespace prl::collective {

enum class ReduceOp { kSum, kMax, kMin };

struct CommunicatorOptions {
  absl::Duration timeout = absl::Minutes(5);  // per collective
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where the data-path tensors must live (CPU for Gloo, a CUDA device for NCCL).
  virtual Device device() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl"

  // out (world_size * n) = the ranks' shards (n each) in rank order. Same dtype; any dtype.
  virtual absl::Status AllGather(const Tensor& shard, const Tensor& out) = 0;
  // shard (n) = sum over ranks of in[rank * n, (rank + 1) * n). F32.
  virtual absl::Status ReduceScatter(const Tensor& in, const Tensor& shard) = 0;
  // out[r * n, (r + 1) * n) = rank r's in[rank * n, (rank + 1) * n): in and out (world_size * n),
  // the same dtype; any dtype (Ulysses' exchange of heads for tokens, model/context_heads.h).
  virtual absl::Status AllToAll(const Tensor& in, const Tensor& out) = 0;
  // send to rank `to` while recv (the same bytes) comes from rank `from`; every rank calls it
  // together, as a collective (ring attention's shift of blocks, model/context_ring.h). Any dtype.
  virtual absl::Status SendRecv(const Tensor& send, int to, const Tensor& recv, int from) = 0;
  // data = op over ranks of data, in place. F32.
  virtual absl::Status AllReduce(const Tensor& data, ReduceOp op) = 0;
  // data = root's data, in place. Any dtype.
  virtual absl::Status Broadcast(const Tensor& data, int root) = 0;

  // Host-side control values (token counts, step statistics, checkpoint agreement): exact
  // float64 reductions on CPU memory whatever the backend.
  virtual absl::Status AllReduceHost(absl::Span<double> values, ReduceOp op) = 0;
  virtual absl::Status BroadcastHost(absl::Span<uint8_t> bytes, int root) = 0;

  virtual absl::Status Barrier() = 0;
};

}  // namespace prl::collective
