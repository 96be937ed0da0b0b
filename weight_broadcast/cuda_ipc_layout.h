// The cuda_ipc transport's control segment (internal to weight_broadcast/; tests read it to
// check and to damage segments). The weights themselves live in the publisher's two device
// buffers; this small shared-memory segment says which one holds which version and how to map
// it:
//
//   [CudaIpcHeader, 4 KiB]
//
// Slots are written and read with the two-slot seqlock of weight_broadcast/seqlock.h. A slot's
// payload is its owner and `handle` here plus the device buffer the handle names; the
// publisher's device copy is synchronised before the slot's sequence goes even, and a
// subscriber's copy before it re-checks the sequence.
//
// Owners: device memory belongs to the process that allocated it, so a slot names its owner
// (the publisher's ProcessToken and the segment's `generation` when it was written) and is
// readable only while that owner is the attached publisher and lives. `generation` is bumped
// whenever a publisher detaches, so that a publisher re-created in the same process does not
// own its predecessor's slots. A subscriber drops the mappings of a previous owner and opens
// the new publisher's handles. `readers` counts subscribers copying from a publisher buffer
// right now: a detaching publisher clears `publisher` first, then waits (briefly) for it to
// reach zero before it frees its buffers.
#pragma once

#include <atomic>
#include <cstdint>

#include "weight_broadcast/seqlock.h"

namespace prl::weight_broadcast_internal {

inline constexpr uint64_t kCudaIpcMagic = 0x31435049434c5250ull;  // "PRLCIPC1"
inline constexpr uint32_t kCudaIpcLayoutVersion = 1;
inline constexpr uint64_t kCudaIpcSegmentBytes = 4096;
inline constexpr int kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

// Written once by the creator; covered by fixed_checksum.
struct CudaIpcFixedHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t reserved;
  uint64_t segment_bytes;
  uint64_t weight_bytes;  // one version: the ParameterSet buffer (num_elements * 4)
  int64_t created_unix_ns;
  char fingerprint[1024];  // ModelFingerprint of the model, NUL-terminated
};

struct alignas(64) CudaIpcSlot {
  SeqlockSlot lock;
  A64 publisher;                    // the owner of the buffer `handle` names: its ProcessToken
  A64 generation;                   // and the segment's generation when it wrote the slot
  uint8_t handle[kIpcHandleBytes];  // cudaIpcMemHandle_t of that buffer
};

struct CudaIpcHeader {
  CudaIpcFixedHeader fixed;
  uint64_t fixed_checksum;    // XXH3-64 of `fixed`
  A64 initialized;            // kCudaIpcMagic once the creator finished; set last
  alignas(64) A64 published;  // PackPublished(version, slot) or kNothingPublished
  alignas(64) A64 publisher;  // ProcessToken of the attached publisher; 0: none
  A64 generation;             // bumped at every detach
  alignas(64) A64 readers;    // subscribers copying from a publisher buffer now
  CudaIpcSlot slots[2];
  alignas(64) std::atomic<uint32_t> futex;  // bumped after every publish and detach
};
static_assert(sizeof(CudaIpcHeader) <= kCudaIpcSegmentBytes);

}  // namespace prl::weight_broadcast_internal
