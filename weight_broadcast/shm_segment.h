// Named shared-memory segments of the same-node weight transports (internal to
// weight_broadcast/): the shm transport's weight segment and the cuda_ipc transport's control
// segment. Boost.Interprocess objects in /dev/shm, owner-only (0600), mapped MAP_SHARED.
//
// What every such segment shares, and this file owns:
//   - names: 1 to 200 characters of [A-Za-z0-9._-];
//   - creation (zero pages, AlreadyExists if the name is taken) and opening (Unavailable while
//     smaller than a header: being created, or its creator died creating it);
//   - the header checks, in this order: magic (DataLoss: not ours), layout version
//     (FailedPrecondition), checksum of the creator's fixed fields (DataLoss), size against the
//     header (DataLoss), `initialized` set last by the creator (Unavailable). Every message
//     names the segment and how to remove it;
//   - the publisher role: one live publisher per segment, claimed with a compare-exchange from
//     nobody or from a dead process (ProcessToken), so that a restarted publisher adopts it.
// The layouts themselves (shm_layout.h, cuda_ipc_layout.h) belong to their transports.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prl::weight_broadcast_internal {

// A kind of segment: what its messages call it and what its header must say.
struct SegmentKind {
  absl::string_view noun;         // "weight segment", "CUDA IPC weight segment"
  absl::string_view remove_hint;  // "RemoveShmWeightSegment, or delete /dev/shm/" (+ the name)
  uint64_t magic = 0;
  uint32_t layout_version = 0;
  uint64_t header_bytes = 0;  // the smallest segment that can hold the header
};

// A mapping of a segment; unmapped on destruction (the segment itself stays).
class SharedSegment {
 public:
  // Creates `name` with `bytes` zero bytes and maps it writable and prefaulted. AlreadyExists
  // if it exists; a segment left half-created by a failure here is removed again.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(const std::string& name,
                                                               uint64_t bytes,
                                                               const SegmentKind& kind);
  // Maps an existing segment (prefaulted with `populate`, for those who copy its slots).
  // NotFound if absent; Unavailable while smaller than kind.header_bytes.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Open(const std::string& name, bool writable,
                                                             bool populate,
                                                             const SegmentKind& kind);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  void* address() const { return address_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedSegment(std::string name, void* address, size_t size)
      : name_(std::move(name)), address_(address), size_(size) {}
  std::string name_;
  void* address_;
  size_t size_;
};

absl::Status ValidateSegmentName(const std::string& name, const SegmentKind& kind);
// Deletes the segment (mappings stay valid). NotFound if absent.
absl::Status RemoveSegment(const std::string& name, const SegmentKind& kind);

// The fields every segment header starts with, as read from a mapping.
struct SegmentPreamble {
  uint64_t magic = 0;
  uint32_t layout_version = 0;
  uint64_t segment_bytes = 0;
  bool checksum_ok = false;  // the creator's fixed fields are intact
  bool initialized = false;  // the creator finished
};
// The header checks (see the file comment) of a segment mapped with `mapped_bytes`.
absl::Status CheckPreamble(const SegmentPreamble& p, size_t mapped_bytes, const std::string& name,
                           const SegmentKind& kind);
// Gives a concurrent creator up to a second to set `initialized` to `magic`.
void WaitUntilInitialized(const std::atomic<uint64_t>& initialized, uint64_t magic);

// Makes this process the segment's publisher: `publisher` goes from 0 or a dead process's
// token to SelfProcessToken(). AlreadyExists naming the live publisher's pid otherwise.
absl::Status ClaimPublisher(std::atomic<uint64_t>& publisher, const std::string& name,
                            const SegmentKind& kind);
// Gives the role up if this process holds it.
void ReleasePublisher(std::atomic<uint64_t>& publisher);

}  // namespace prl::weight_broadcast_internal
