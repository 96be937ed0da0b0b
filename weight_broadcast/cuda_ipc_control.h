// CudaIpcControl (internal to weight_broadcast/): the cuda_ipc transport's control segment
// (layout and protocol in cuda_ipc_layout.h) and everything about it that needs no GPU:
// creating, adopting and opening it, the handshake, the publisher role and who owns which
// slot, and the seqlocked slots that name the device buffers by their CUDA IPC handles. The
// transport (cuda_ipc_transport.cc) adds the device memory; tests drive this class without a GPU.
//
// Thread-safety: the publisher side from one thread; the reader side from the one receiver
// thread of a subscriber; any number of processes at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/config.h"
#include "weight_broadcast/cuda_ipc_layout.h"
#include "weight_broadcast/handshake.h"
#include "weight_broadcast/seqlock.h"

namespace prl::weight_broadcast_internal {

class SharedSegment;

using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;

class CudaIpcControl {
 public:
  // Publisher: creates segment `name` for `config`, or adopts an existing one whose publisher
  // is gone (its model must match; its newest version stays, as held_version()), and attaches
  // as its publisher. AlreadyExists while another publisher of it lives.
  static absl::StatusOr<std::unique_ptr<CudaIpcControl>> Attach(const std::string& name,
                                                                const WeightSpec& spec);
  // Subscriber: maps segment `name` (waiting up to `open_timeout` for it to appear) and runs
  // the handshake against `config`. Errors name the segment and what is wrong with it.
  static absl::StatusOr<std::unique_ptr<CudaIpcControl>> Open(const std::string& name,
                                                              const WeightSpec& spec,
                                                              absl::Duration open_timeout);
  ~CudaIpcControl();  // a publisher that has not detached does so

  const std::string& name() const;
  const CudaIpcHeader& header() const;
  int64_t weight_bytes() const;
  // The newest version in the segment; -1 if none was ever published.
  int64_t held_version() const;

  // Who owns a slot's buffer: a publisher process, during one attachment.
  struct Owner {
    uint64_t publisher = 0;  // ProcessToken; 0: nobody
    uint64_t generation = 0;
    bool operator==(const Owner&) const = default;
  };

  // ---- Publisher side ----
  // Starts writing `version` into the slot that is not the newest, naming buffer
  // `handles[slot]` of this publisher; the caller then fills that buffer (completely).
  struct Write {
    int slot = 0;
    uint64_t sequence = 0;
    int64_t version = -1;
  };
  Write BeginWrite(int64_t version, const std::array<IpcHandle, 2>& handles);
  // Publishes the written slot and wakes subscribers.
  void EndWrite(const Write& write);
  // Gives up the publisher role (subscribers stop reading its buffers) and waits up to
  // `drain` for copies in progress; false if some were still running (or a reader died
  // mid-copy). Afterwards the buffers may be freed. Idempotent.
  bool Detach(absl::Duration drain);

  // ---- Reader side ----
  enum class ReadState {
    kNothing,  // nothing published
    kBusy,     // the newest slot is being written: read again
    kStale,    // the newest slot names memory of a publisher that is not attached or not alive
    kReady,    // *view describes the newest version
  };
  struct SlotView {
    SlotRead read;
    Owner owner;
    IpcHandle handle{};
  };
  ReadState BeginRead(SlotView* view) const;
  // Counts this process among the readers of `owner`'s buffers; false (and not counted) if it
  // is no longer the attached publisher. Pair with LeaveReader.
  bool EnterReader(const Owner& owner);
  void LeaveReader();
  // After the copy completed: true if it is version view.read.version, intact (the slot was
  // not rewritten and its owner is still attached and alive).
  bool EndRead(const SlotView& view) const;
  // The attached publisher (publisher 0 if none).
  Owner attached() const;
  // Waits until the futex word moves from `seen` (a publish or a detach) or `timeout_ns`.
  uint32_t futex_value() const;
  void WaitForChange(uint32_t seen, int64_t timeout_ns) const;

 private:
  CudaIpcControl(std::unique_ptr<SharedSegment> segment, bool publisher);
  CudaIpcHeader& mutable_header() const;

  std::unique_ptr<SharedSegment> segment_;
  bool attached_ = false;  // this object is the segment's publisher (until Detach)
};

// The segment's side of the handshake ("cuda_ipc", its fingerprint and version bytes).
WeightHandshake CudaIpcSegmentHandshake(const CudaIpcHeader& header);

// Facts about a segment (for operators and tests), read without attaching to it.
struct CudaIpcSegmentInfo {
  int64_t weight_bytes = 0;
  std::string model_fingerprint;
  int64_t newest_version = -1;  // -1: nothing published yet
  int32_t publisher_pid = 0;    // 0: no publisher attached
  bool publisher_alive = false;
  int64_t readers = 0;
};
absl::StatusOr<CudaIpcSegmentInfo> InspectCudaIpcSegment(const std::string& name);
absl::Status RemoveCudaIpcSegment(const std::string& name);

}  // namespace prl::weight_broadcast_internal
