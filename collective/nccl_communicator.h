// NcclCommunicator: the Communicator over NCCL, for CUDA tensors on one GPU per rank. Built
// by ConnectNccl (collective/rendezvous.h): rank 0 creates the ncclUniqueId and publishes it
// through the rendezvous store; every rank then joins with ncclCommInitRankConfig.
//
// Time-outs, the documented NCCL way: the communicator is non-blocking (ncclConfig_t
// blocking = 0); each call enqueues its operation on the communicator's stream and polls
// ncclCommGetAsyncError and the stream until done or the deadline passes, then aborts the
// communicator (ncclCommAbort) and returns DeadlineExceeded. An NCCL error (a peer died, a
// network failure) is Unavailable. After either the communicator is poisoned, as every
// backend's.
//
// Every call is synchronous: it returns when its stream is idle. The stream is a blocking
// stream, so work on the legacy default stream is ordered before and after it. Host-side
// values (AllReduceHost, BroadcastHost, Barrier) go through a small device staging buffer.
//
// Compiled only in CUDA builds with NCCL (PRL_WITH_NCCL); elsewhere ConnectNccl returns
// Unimplemented (collective/nccl_none.cc).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "collective/communicator.h"
#include "collective/kv_store.h"
#include "core/buffer.h"

struct ncclComm;
struct CUstream_st;

namespace prl::collective {

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (initialised) and `stream`.
  NcclCommunicator(ncclComm* comm, CUstream_st* stream, int rank, int world_size, Device device,
                   std::shared_ptr<KvStore> store, const CommunicatorOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return device_; }
  std::string backend() const override { return "nccl"; }

  absl::Status AllGather(const Tensor& shard, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& shard) override;
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override;
  absl::Status SendRecv(const Tensor& send, int to, const Tensor& recv, int from) override;
  absl::Status AllReduce(const Tensor& data, ReduceOp op) override;
  absl::Status Broadcast(const Tensor& data, int root) override;
  absl::Status AllReduceHost(absl::Span<double> values, ReduceOp op) override;
  absl::Status BroadcastHost(absl::Span<uint8_t> bytes, int root) override;
  absl::Status Barrier() override;

 private:
  // Enqueues with `enqueue` (an NCCL call returning ncclResult_t as int) and waits for the
  // stream, unless poisoned.
  absl::Status Run(const char* op, absl::FunctionRef<int()> enqueue);
  absl::Status Wait(const char* op);
  absl::Status Fail(absl::Status status);
  absl::Status CheckTensor(const char* op, const char* name, const Tensor& t, bool f32_only);
  absl::Status EnsureStaging(size_t bytes);
  absl::Status Copy(void* dst, const void* src, size_t bytes);  // host <-> staging
  std::string Where(const char* op) const;  // "collective all_gather on rank 1 of 3"

  ncclComm* comm_;
  CUstream_st* stream_;
  int rank_;
  int world_size_;
  Device device_;
  std::shared_ptr<KvStore> store_;
  CommunicatorOptions options_;
  absl::Status poisoned_;
  bool aborted_ = false;  // ncclCommAbort was called: only destruction is left
  Buffer staging_;        // device bytes for host-side values
};

}  // namespace prl::collective
