#include "collective/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collective/gloo_store.h"
#include "collective/rendezvous.h"
#include "core/status_macros.h"

namespace prl::collective {

namespace {

// Gloo's own slot prefixes are 0x01..0x08 (gloo/types.h).
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kSendRecvSlotPrefix = 0x41;
// ReduceScatter's message size, as Gloo's ring all-reduce: big enough to amortise a message,
// small enough that the incoming buffer stays in cache while it is summed.
constexpr size_t kSegmentFloats = 256 * 1024;  // 1 MB

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn ReduceFunction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<ReduceFn>(&gloo::sum<T>);
    case ReduceOp::kMax:
      return static_cast<ReduceFn>(&gloo::max<T>);
    case ReduceOp::kMin:
      return static_cast<ReduceFn>(&gloo::min<T>);
  }
  return nullptr;
}

// At least 1 ms (Gloo reads 0 as "no time-out"), at most a year (deadlines must not overflow).
std::chrono::milliseconds ToMilliseconds(absl::Duration d) {
  return std::chrono::milliseconds(
      absl::ToInt64Milliseconds(std::clamp(d, absl::Milliseconds(1), absl::Hours(24 * 365))));
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// Writing to a peer that died raises SIGPIPE, whose default action ends the survivor.
void IgnoreSigpipe() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

absl::Status ValidateOptions(const CommunicatorOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("CommunicatorOptions::timeout ",
                                                   absl::FormatDuration(options.timeout),
                                                   ": expected a positive duration"));
  }
  return absl::OkStatus();
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context,
                                   std::shared_ptr<KvStore> store,
                                   const CommunicatorOptions& options)
    : context_(std::move(context)),
      store_(std::move(store)),
      options_(options),
      rank_(context_->rank),
      world_size_(context_->size) {}

GlooCommunicator::~GlooCommunicator() = default;

std::string GlooCommunicator::Where(absl::string_view op) const {
  return absl::StrCat("collective ", op, " on rank ", rank_, " of ", world_size_);
}

absl::Status GlooCommunicator::Fail(absl::Status status) {
  if (poisoned_.ok()) poisoned_ = std::move(status);
  return poisoned_;
}

absl::Status GlooCommunicator::Run(
    absl::string_view op, absl::Duration timeout,
    absl::FunctionRef<void(uint32_t tag, std::chrono::milliseconds timeout)> body) {
  if (!poisoned_.ok()) return poisoned_;
  try {
    body(next_tag_++, ToMilliseconds(timeout));
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    // Gloo reports its own time-outs as "Timed out waiting <ms>ms for recv/send ...".
    if (absl::StrContains(e.what(), "Timed out")) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(Where(op), ": no answer from a peer within ", SecondsString(timeout),
                       " (a rank died or hung): ", e.what())));
    }
    return Fail(absl::UnavailableError(absl::StrCat(
        Where(op),
        ": lost the connection to a peer (a rank died or its network failed): ", e.what())));
  } catch (const std::exception& e) {  // gloo::Exception, gloo::EnforceNotMet, std::bad_alloc
    return Fail(absl::InternalError(absl::StrCat(Where(op), ": gloo failed: ", e.what())));
  }
}

absl::Status GlooCommunicator::CheckTensor(absl::string_view op, absl::string_view name,
                                           const Tensor& t, const DType* dtype) {
  if (!t.device.is_cpu()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " is on ",
                                                        t.device.ToString(),
                                                        "; the gloo backend needs CPU tensors")));
  }
  if (dtype != nullptr && t.dtype != *dtype) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(op), ": ", name, " is ", DTypeName(t.dtype), ", expected ", DTypeName(*dtype))));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(op), ": ", name, " ", t.ShapeString(), " has no data (null pointer)")));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const Tensor& shard, const Tensor& out) {
  constexpr absl::string_view kOp = "all_gather";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "shard", shard, nullptr));
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "out", out, &shard.dtype));
  if (out.numel() != world_size_ * shard.numel()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(kOp), ": out ", out.ShapeString(), " has ", out.numel(),
                     " elements, expected world_size (", world_size_, ") * shard ",
                     shard.ShapeString(), " = ", world_size_ * shard.numel())));
  }
  const size_t bytes = shard.bytes();
  char* mine = static_cast<char*>(out.data) + rank_ * bytes;
  // Shard already in place (FSDP gathers into the buffer that holds its own shard): no input.
  const bool in_place = shard.data == mine;
  if (!in_place && Overlap(shard.data, bytes, out.data, out.bytes())) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(kOp), ": shard overlaps out without being out's slice of rank ", rank_)));
  }
  if (bytes == 0) return absl::OkStatus();
  if (world_size_ == 1) {
    if (!in_place) std::memcpy(mine, shard.data, bytes);
    return absl::OkStatus();
  }
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    gloo::AllgatherOptions opts(context_);
    if (!in_place) opts.setInput(static_cast<uint8_t*>(shard.data), bytes);
    opts.setOutput(static_cast<uint8_t*>(out.data), out.bytes());
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allgather(opts);
  });
}

void GlooCommunicator::RingReduceScatter(const float* in, float* shard, size_t n, uint32_t tag,
                                         std::chrono::milliseconds timeout) {
  // Ring reduce-scatter: in step s every rank sends its running sum of chunk (rank - s - 1) to
  // the right and adds the left's running sum of chunk (rank - s - 2) to its own input, so
  // after world_size - 1 steps it holds the total of chunk `rank`. Each rank sends and
  // receives (world_size - 1) * n values: the minimum. Chunks travel as 1 MB segments, two
  // in flight, each summed as it lands; a pair delivers its messages in order.
  const int w = world_size_;
  const size_t segment = std::min(n, kSegmentFloats);
  const size_t segments = (n + segment - 1) / segment;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  recv_scratch_.resize(2 * segment);
  partial_scratch_.resize(n);
  auto in_buf = context_->createUnboundBuffer(const_cast<float*>(in), w * n * sizeof(float));
  auto partial_buf = context_->createUnboundBuffer(partial_scratch_.data(), n * sizeof(float));
  auto recv_buf =
      context_->createUnboundBuffer(recv_scratch_.data(), recv_scratch_.size() * sizeof(float));
  const int right = (rank_ + 1) % w;
  const int left = (rank_ + w - 1) % w;
  auto count_of = [&](size_t k) { return std::min(segment, n - k * segment); };
  auto post_recv = [&](size_t k) {
    recv_buf->recv(left, slot, (k % 2) * segment * sizeof(float), count_of(k) * sizeof(float));
  };
  for (int s = 0; s < w - 1; ++s) {
    const int send_chunk = (rank_ - s - 1 + 2 * w) % w;
    const int recv_chunk = (rank_ - s - 2 + 2 * w) % w;
    auto& sender = s == 0 ? in_buf : partial_buf;
    const size_t send_base = s == 0 ? send_chunk * n : 0;  // floats
    for (size_t k = 0; k < segments; ++k) {
      sender->send(right, slot, (send_base + k * segment) * sizeof(float),
                   count_of(k) * sizeof(float));
    }
    post_recv(0);
    if (segments > 1) post_recv(1);
    const float* own = in + recv_chunk * n;
    for (size_t k = 0; k < segments; ++k) {
      recv_buf->waitRecv(deadline);
      sender->waitSend(deadline);  // segment k of partial_scratch_ has left: it may be rewritten
      const float* incoming = recv_scratch_.data() + (k % 2) * segment;
      float* sum = partial_scratch_.data() + k * segment;
      const float* mine = own + k * segment;
      for (size_t i = 0; i < count_of(k); ++i) sum[i] = mine[i] + incoming[i];
      if (k + 2 < segments) post_recv(k + 2);
    }
  }
  std::memcpy(shard, partial_scratch_.data(), n * sizeof(float));
}

absl::Status GlooCommunicator::ReduceScatter(const Tensor& in, const Tensor& shard) {
  constexpr absl::string_view kOp = "reduce_scatter";
  if (!poisoned_.ok()) return poisoned_;
  const DType f32 = DType::kF32;
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "in", in, &f32));
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "shard", shard, &f32));
  if (in.numel() != world_size_ * shard.numel()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(kOp), ": in ", in.ShapeString(), " has ", in.numel(),
                     " elements, expected world_size (", world_size_, ") * shard ",
                     shard.ShapeString(), " = ", world_size_ * shard.numel())));
  }
  const size_t n = static_cast<size_t>(shard.numel());
  if (n == 0) return absl::OkStatus();
  if (world_size_ == 1) {
    std::memmove(shard.data, in.data, shard.bytes());
    return absl::OkStatus();
  }
  // The result goes through partial_scratch_, so shard may alias any part of in.
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    RingReduceScatter(in.f32(), shard.f32(), n, tag, timeout);
  });
}

absl::Status GlooCommunicator::AllToAll(const Tensor& in, const Tensor& out) {
  constexpr absl::string_view kOp = "all_to_all";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "in", in, nullptr));
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "out", out, &in.dtype));
  if (out.numel() != in.numel() || in.numel() % world_size_ != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(kOp), ": in ", in.ShapeString(), " and out ", out.ShapeString(),
        " must have the same number of elements, a multiple of world_size (", world_size_, ")")));
  }
  if (Overlap(in.data, in.bytes(), out.data, out.bytes())) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(Where(kOp), ": in overlaps out")));
  }
  if (in.numel() == 0) return absl::OkStatus();
  if (world_size_ == 1) {
    std::memcpy(out.data, in.data, in.bytes());
    return absl::OkStatus();
  }
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    gloo::AlltoallOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), in.bytes());
    opts.setOutput(static_cast<uint8_t*>(out.data), out.bytes());
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::alltoall(opts);
  });
}

absl::Status GlooCommunicator::SendRecv(const Tensor& send, int to, const Tensor& recv,
                                        int from) {
  constexpr absl::string_view kOp = "send_recv";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "send", send, nullptr));
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "recv", recv, &send.dtype));
  if (recv.numel() != send.numel() || to < 0 || to >= world_size_ || from < 0 ||
      from >= world_size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(kOp), ": send ", send.ShapeString(), " to rank ", to, ", recv ", recv.ShapeString(),
        " from rank ", from, ": expected equal sizes and ranks in [0, ", world_size_, ")")));
  }
  if (Overlap(send.data, send.bytes(), recv.data, recv.bytes())) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(Where(kOp), ": send overlaps recv")));
  }
  if (send.numel() == 0) return absl::OkStatus();
  if (to == rank_ && from == rank_) {
    std::memcpy(recv.data, send.data, send.bytes());
    return absl::OkStatus();
  }
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    const uint64_t slot = gloo::Slot::build(kSendRecvSlotPrefix, tag);
    auto in = context_->createUnboundBuffer(recv.data, recv.bytes());
    auto out = context_->createUnboundBuffer(send.data, send.bytes());
    in->recv(from, slot);
    out->send(to, slot);
    in->waitRecv(timeout);
    out->waitSend(timeout);
  });
}

absl::Status GlooCommunicator::AllReduce(const Tensor& data, ReduceOp op) {
  constexpr absl::string_view kOp = "all_reduce";
  if (!poisoned_.ok()) return poisoned_;
  const DType f32 = DType::kF32;
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "data", data, &f32));
  if (data.numel() == 0 || world_size_ == 1) return absl::OkStatus();
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.f32(), static_cast<size_t>(data.numel()));
    opts.setReduceFunction(ReduceFunction<float>(op));
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::Broadcast(const Tensor& data, int root) {
  constexpr absl::string_view kOp = "broadcast";
  if (!poisoned_.ok()) return poisoned_;
  PRL_RETURN_IF_ERROR(CheckTensor(kOp, "data", data, nullptr));
  return BroadcastHost(absl::MakeSpan(static_cast<uint8_t*>(data.data), data.bytes()), root);
}

absl::Status GlooCommunicator::AllReduceHost(absl::Span<double> values, ReduceOp op) {
  constexpr absl::string_view kOp = "all_reduce_host";
  if (!poisoned_.ok()) return poisoned_;
  if (values.empty() || world_size_ == 1) return absl::OkStatus();
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(values.data(), values.size());
    opts.setReduceFunction(ReduceFunction<double>(op));
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::BroadcastHost(absl::Span<uint8_t> bytes, int root) {
  constexpr absl::string_view kOp = "broadcast";
  if (!poisoned_.ok()) return poisoned_;
  if (root < 0 || root >= world_size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(kOp), ": root ", root, " is not a rank (expected 0 <= root < ", world_size_, ")")));
  }
  if (bytes.empty() || world_size_ == 1) return absl::OkStatus();
  return Run(kOp, options_.timeout, [&](uint32_t tag, std::chrono::milliseconds timeout) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(bytes.data(), bytes.size());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() { return BarrierWithin(options_.timeout); }

absl::Status GlooCommunicator::BarrierWithin(absl::Duration timeout) {
  if (!poisoned_.ok()) return poisoned_;
  if (world_size_ == 1) return absl::OkStatus();
  return Run("barrier", timeout, [&](uint32_t tag, std::chrono::milliseconds timeout_ms) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_ms);
    gloo::barrier(opts);
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(const RendezvousConfig& rendezvous,
                                                          const CommunicatorOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateRendezvous(rendezvous));
  PRL_RETURN_IF_ERROR(ValidateOptions(options));
  PRL_ASSIGN_OR_RETURN(std::shared_ptr<KvStore> store, OpenRendezvousStore(rendezvous));
  return ConnectGlooThrough(std::move(store), rendezvous, options);
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGlooThrough(
    std::shared_ptr<KvStore> store, const RendezvousConfig& rendezvous,
    const CommunicatorOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateGroup(rendezvous));
  PRL_RETURN_IF_ERROR(ValidateOptions(options));
  if (store == nullptr) return absl::InvalidArgumentError("ConnectGlooThrough: no store");
  IgnoreSigpipe();
  const std::string where =
      absl::StrCat("gloo rendezvous of rank ", rendezvous.rank, " of ", rendezvous.world_size,
                   " (group '", rendezvous.group_name, "')");
  PRL_ASSIGN_OR_RETURN(const std::string host, LocalAddressFacing(rendezvous.master_addr));
  GlooStore gloo_store(store, absl::StrCat(rendezvous.group_name, "/gloo/"), rendezvous.timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rendezvous.rank, rendezvous.world_size);
    // Connecting waits for the slowest rank; the collectives then use their own time-out.
    context->setTimeout(ToMilliseconds(rendezvous.timeout));
    context->connectFullMesh(gloo_store, device);
    context->setTimeout(ToMilliseconds(options.timeout));
  } catch (const std::exception& e) {
    const absl::Status store_error = gloo_store.error();
    if (!store_error.ok()) {
      return absl::Status(store_error.code(), absl::StrCat(where, ": ", store_error.message()));
    }
    return absl::UnavailableError(
        absl::StrCat(where, ": cannot connect to the other ranks from ", host, ": ", e.what()));
  }
  auto comm = std::make_unique<GlooCommunicator>(context, store, options);
  // Once every rank is past this barrier, every rank has read every address: the keys go, so
  // that a FileStore directory is clean for the next run.
  const absl::Status connected = comm->BarrierWithin(rendezvous.timeout);
  if (!connected.ok()) {
    return absl::Status(connected.code(), absl::StrCat(where, ": ", connected.message()));
  }
  for (const std::string& key : gloo_store.keys_set()) store->Delete(key).IgnoreError();
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace prl::collective
