#include "collective/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collective/rendezvous.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"

namespace prl::collective {

namespace {

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

std::string NcclText(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&text, " (", last, ")");
  return text;
}

// Polls a non-blocking communicator until its pending work (init, finalize, an enqueue) is
// done. Returns ncclSuccess, an error, or ncclInProgress when `deadline` passed first.
ncclResult_t PollAsync(ncclComm_t comm, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::chrono::steady_clock::time_point DeadlineAfter(absl::Duration d) {
  d = std::min(d, absl::Hours(24 * 365));
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             absl::ToChronoNanoseconds(d));
}

// NCCL needs one CUDA GPU per rank, and this one must exist here.
absl::Status CheckNcclDevice(Device device) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ConnectNccl: device ", device.ToString(),
        " is not a CUDA device (NCCL needs one GPU per rank; use ConnectGloo for CPU tensors)"));
  }
  const int gpus = cuda::DeviceCount();
  if (gpus == 0) {
    return absl::FailedPreconditionError(
        "ConnectNccl: no CUDA GPU is visible (no driver or no device): NCCL needs one GPU per "
        "rank; use ConnectGloo on machines without GPUs");
  }
  if (device.index < 0 || device.index >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ConnectNccl: ", device.ToString(), " does not exist: this machine has ", gpus, " GPU(s)"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const CommunicatorOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("CommunicatorOptions::timeout ",
                                                   absl::FormatDuration(options.timeout),
                                                   ": expected a positive duration"));
  }
  return absl::OkStatus();
}

}  // namespace

bool NcclCompiled() { return true; }

NcclCommunicator::NcclCommunicator(ncclComm* comm, CUstream_st* stream, int rank, int world_size,
                                   Device device, std::shared_ptr<KvStore> store,
                                   const CommunicatorOptions& options)
    : comm_(comm),
      stream_(stream),
      rank_(rank),
      world_size_(world_size),
      device_(device),
      store_(std::move(store)),
      options_(options) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_.index);
  if (!aborted_) {  // ncclCommAbort frees the communicator itself
    // A healthy communicator flushes and is destroyed; one whose peers may be gone is aborted
    // (ncclCommFinalize would wait for them).
    bool finalized = false;
    if (poisoned_.ok()) {
      const ncclResult_t r = ncclCommFinalize(comm_);
      finalized = (r == ncclSuccess || r == ncclInProgress) &&
                  PollAsync(comm_, DeadlineAfter(options_.timeout)) == ncclSuccess;
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::Where(const char* op) const {
  return absl::StrCat("collective ", op, " on rank ", rank_, " of ", world_size_, " (nccl)");
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (poisoned_.ok()) poisoned_ = std::move(status);
  return poisoned_;
}

absl::Status NcclCommunicator::CheckTensor(const char* op, const char* name, const Tensor& t,
                                           bool f32_only) {
  if (t.device != device_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": ", name, " is on ", t.device.ToString(), ", expected ", device_.ToString())));
  }
  if (f32_only && t.dtype != DType::kF32) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(op), ": ", name, " is ", DTypeName(t.dtype), ", expected F32")));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Wait(const char* op) {
  const auto deadline = DeadlineAfter(options_.timeout);
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r == ncclSuccess) r = state;
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string text = NcclText(r, comm_);
      ncclCommAbort(comm_);
      aborted_ = true;
      return Fail(absl::UnavailableError(
          absl::StrCat(Where(op), ": NCCL failed (a rank died or its network failed): ", text)));
    }
    if (r == ncclSuccess) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        return Fail(absl::InternalError(
            absl::StrCat(Where(op), ": CUDA stream failed: ", cudaGetErrorString(q))));
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ncclCommAbort(comm_);
      aborted_ = true;
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(Where(op), ": no answer from a peer within ",
                       SecondsString(options_.timeout), " (a rank died or hung)")));
    }
    std::this_thread::yield();
  }
}

absl::Status NcclCommunicator::Run(const char* op, absl::FunctionRef<int()> enqueue) {
  if (!poisoned_.ok()) return poisoned_;
  const cudaError_t set = cudaSetDevice(device_.index);
  if (set != cudaSuccess) {
    return Fail(absl::InternalError(
        absl::StrCat(Where(op), ": cudaSetDevice failed: ", cudaGetErrorString(set))));
  }
  const auto r = static_cast<ncclResult_t>(enqueue());
  if (r != ncclSuccess && r != ncclInProgress) {
    return Fail(absl::InternalError(absl::StrCat(Where(op), ": ", NcclText(r, comm_))));
  }
  return Wait(op);
}

absl::Status NcclCommunicator::EnsureStaging(size_t bytes) {
  if (staging_.bytes() >= bytes) return absl::OkStatus();
  absl::StatusOr<Buffer> staging = Buffer::Allocate(device_, std::max<size_t>(bytes, 4096));
  if (!staging.ok()) return Fail(staging.status());
  staging_ = std::move(staging).value();
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Copy(void* dst, const void* src, size_t bytes) {
  absl::Status s = PRL_CUDA_STATUS(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return s.ok() ? s : Fail(std::move(s));
}

absl::Status NcclCommunicator::AllGather(const Tensor& shard, const Tensor& out) {
  const char* op = "all_gather";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(op, "shard", shard, false));
  PRL_RETURN_IF_ERROR(CheckTensor(op, "out", out, false));
  if (out.dtype != shard.dtype || out.numel() != world_size_ * shard.numel()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": out ", out.ShapeString(), " ", DTypeName(out.dtype), " has ", out.numel(),
        " elements, expected world_size (", world_size_, ") * shard ", shard.ShapeString(), " = ",
        world_size_ * shard.numel(), " of ", DTypeName(shard.dtype))));
  }
  if (shard.numel() == 0) return absl::OkStatus();
  return Run(op, [&] {
    return static_cast<int>(
        ncclAllGather(shard.data, out.data, shard.bytes(), ncclUint8, comm_, stream_));
  });
}

absl::Status NcclCommunicator::ReduceScatter(const Tensor& in, const Tensor& shard) {
  const char* op = "reduce_scatter";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(op, "in", in, true));
  PRL_RETURN_IF_ERROR(CheckTensor(op, "shard", shard, true));
  if (in.numel() != world_size_ * shard.numel()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(op), ": in ", in.ShapeString(), " has ", in.numel(),
                     " elements, expected world_size (", world_size_, ") * shard ",
                     shard.ShapeString(), " = ", world_size_ * shard.numel())));
  }
  if (shard.numel() == 0) return absl::OkStatus();
  return Run(op, [&] {
    return static_cast<int>(ncclReduceScatter(in.data, shard.data,
                                              static_cast<size_t>(shard.numel()), ncclFloat32,
                                              ncclSum, comm_, stream_));
  });
}

absl::Status NcclCommunicator::AllToAll(const Tensor& in, const Tensor& out) {
  const char* op = "all_to_all";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(op, "in", in, false));
  PRL_RETURN_IF_ERROR(CheckTensor(op, "out", out, false));
  if (out.dtype != in.dtype || out.numel() != in.numel() || in.numel() % world_size_ != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": in ", in.ShapeString(), " and out ", out.ShapeString(),
        " must have the same dtype and number of elements, a multiple of world_size (",
        world_size_, ")")));
  }
  if (in.numel() == 0) return absl::OkStatus();
  // One send and one receive per peer in a group: NCCL's all-to-all (no collective of its own).
  const size_t block = in.bytes() / world_size_;
  return Run(op, [&] {
    auto ok = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
    ncclResult_t r = ncclGroupStart();
    for (int peer = 0; peer < world_size_ && ok(r); ++peer) {
      r = ncclSend(static_cast<const char*>(in.data) + peer * block, block, ncclUint8, peer,
                   comm_, stream_);
      if (ok(r)) {
        r = ncclRecv(static_cast<char*>(out.data) + peer * block, block, ncclUint8, peer, comm_,
                     stream_);
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    return static_cast<int>(ok(r) ? end : r);
  });
}

absl::Status NcclCommunicator::SendRecv(const Tensor& send, int to, const Tensor& recv,
                                        int from) {
  const char* op = "send_recv";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(op, "send", send, false));
  PRL_RETURN_IF_ERROR(CheckTensor(op, "recv", recv, false));
  if (recv.dtype != send.dtype || recv.numel() != send.numel() || to < 0 ||
      to >= world_size_ || from < 0 || from >= world_size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": send ", send.ShapeString(), " to rank ", to, ", recv ", recv.ShapeString(),
        " from rank ", from, ": expected the same dtype and size, ranks in [0, ", world_size_,
        ")")));
  }
  if (send.numel() == 0) return absl::OkStatus();
  return Run(op, [&] {
    auto ok = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
    ncclResult_t r = ncclGroupStart();
    if (ok(r)) r = ncclSend(send.data, send.bytes(), ncclUint8, to, comm_, stream_);
    if (ok(r)) r = ncclRecv(recv.data, recv.bytes(), ncclUint8, from, comm_, stream_);
    const ncclResult_t end = ncclGroupEnd();
    return static_cast<int>(ok(r) ? end : r);
  });
}

absl::Status NcclCommunicator::AllReduce(const Tensor& data, ReduceOp reduce) {
  const char* op = "all_reduce";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(op, "data", data, true));
  if (data.numel() == 0) return absl::OkStatus();
  return Run(op, [&] {
    return static_cast<int>(ncclAllReduce(data.data, data.data, static_cast<size_t>(data.numel()),
                                          ncclFloat32, NcclOp(reduce), comm_, stream_));
  });
}

absl::Status NcclCommunicator::Broadcast(const Tensor& data, int root) {
  const char* op = "broadcast";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(op, "data", data, false));
  if (root < 0 || root >= world_size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": root ", root, " is not a rank (expected 0 <= root < ", world_size_, ")")));
  }
  if (data.numel() == 0) return absl::OkStatus();
  return Run(op, [&] {
    return static_cast<int>(
        ncclBroadcast(data.data, data.data, data.bytes(), ncclUint8, root, comm_, stream_));
  });
}

absl::Status NcclCommunicator::AllReduceHost(absl::Span<double> values, ReduceOp reduce) {
  const char* op = "all_reduce_host";
  if (!poisoned_.ok()) return poisoned_;
  if (values.empty()) return absl::OkStatus();
  const size_t bytes = values.size() * sizeof(double);
  PRL_RETURN_IF_ERROR(EnsureStaging(bytes));
  PRL_RETURN_IF_ERROR(Copy(staging_.data(), values.data(), bytes));
  PRL_RETURN_IF_ERROR(Run(op, [&] {
    return static_cast<int>(ncclAllReduce(staging_.data(), staging_.data(), values.size(),
                                          ncclFloat64, NcclOp(reduce), comm_, stream_));
  }));
  PRL_RETURN_IF_ERROR(Copy(values.data(), staging_.data(), bytes));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::BroadcastHost(absl::Span<uint8_t> bytes, int root) {
  const char* op = "broadcast_host";
  if (!poisoned_.ok()) return poisoned_;
  if (root < 0 || root >= world_size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": root ", root, " is not a rank (expected 0 <= root < ", world_size_, ")")));
  }
  if (bytes.empty()) return absl::OkStatus();
  PRL_RETURN_IF_ERROR(EnsureStaging(bytes.size()));
  PRL_RETURN_IF_ERROR(Copy(staging_.data(), bytes.data(), bytes.size()));
  PRL_RETURN_IF_ERROR(Run(op, [&] {
    return static_cast<int>(ncclBroadcast(staging_.data(), staging_.data(), bytes.size(), ncclUint8,
                                          root, comm_, stream_));
  }));
  PRL_RETURN_IF_ERROR(Copy(bytes.data(), staging_.data(), bytes.size()));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(EnsureStaging(sizeof(float)));
  return Run("barrier", [&] {
    return static_cast<int>(
        ncclAllReduce(staging_.data(), staging_.data(), 1, ncclFloat32, ncclSum, comm_, stream_));
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(const RendezvousConfig& rendezvous,
                                                          Device device,
                                                          const CommunicatorOptions& options) {
  PRL_RETURN_IF_ERROR(CheckNcclDevice(device));
  PRL_RETURN_IF_ERROR(ValidateRendezvous(rendezvous));
  PRL_RETURN_IF_ERROR(CheckOptions(options));
  PRL_ASSIGN_OR_RETURN(std::shared_ptr<KvStore> store, OpenRendezvousStore(rendezvous));
  return ConnectNcclThrough(std::move(store), rendezvous, device, options);
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNcclThrough(
    std::shared_ptr<KvStore> store, const RendezvousConfig& rendezvous, Device device,
    const CommunicatorOptions& options) {
  PRL_RETURN_IF_ERROR(CheckNcclDevice(device));
  PRL_RETURN_IF_ERROR(ValidateGroup(rendezvous));
  PRL_RETURN_IF_ERROR(CheckOptions(options));
  if (store == nullptr) return absl::InvalidArgumentError("ConnectNcclThrough: no store");
  const std::string where =
      absl::StrCat("nccl rendezvous of rank ", rendezvous.rank, " of ", rendezvous.world_size,
                   " (group '", rendezvous.group_name, "')");
  const std::string key = absl::StrCat(rendezvous.group_name, "/nccl/unique_id");
  ncclUniqueId id;
  if (rendezvous.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::UnavailableError(
          absl::StrCat(where, ": ncclGetUniqueId failed: ", NcclText(r, nullptr)));
    }
    PRL_RETURN_IF_ERROR(store->Set(key, absl::string_view(id.internal, sizeof(id.internal))));
  } else {
    absl::StatusOr<std::string> value = store->Get(key, rendezvous.timeout);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat(where, ": ", value.status().message()));
    }
    if (value->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat(where, ": the unique id under '", key, "' has ",
                                              value->size(), " bytes, expected ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }

  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; Wait polls with a deadline
  ncclComm_t comm = nullptr;
  ncclResult_t r =
      ncclCommInitRankConfig(&comm, rendezvous.world_size, id, rendezvous.rank, &config);
  if (r == ncclSuccess || r == ncclInProgress) {
    r = PollAsync(comm, DeadlineAfter(rendezvous.timeout));
  }
  if (r != ncclSuccess) {
    const std::string text = NcclText(r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    if (r == ncclInProgress) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": not every rank joined within ",
                                                      SecondsString(rendezvous.timeout)));
    }
    return absl::UnavailableError(absl::StrCat(where, ": ncclCommInitRankConfig failed: ", text));
  }
  cudaStream_t stream = nullptr;
  const cudaError_t made = cudaStreamCreate(&stream);  // blocking: ordered with stream 0
  if (made != cudaSuccess) {
    ncclCommAbort(comm);
    return absl::InternalError(
        absl::StrCat(where, ": cudaStreamCreate failed: ", cudaGetErrorString(made)));
  }
  // Every rank used the id to join: it can go.
  if (rendezvous.rank == 0) store->Delete(key).IgnoreError();
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      comm, stream, rendezvous.rank, rendezvous.world_size, device, store, options));
}

}  // namespace prl::collective
