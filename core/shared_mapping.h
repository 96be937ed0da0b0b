// MapShared: maps a shared-memory object (a POSIX shm file descriptor) and, on request,
// prefaults it, so that the first pass over a big segment (the replay ring, a weight slot)
// does not take a page fault per 4 KiB and run at half the memory bandwidth. Used by the
// replay buffer and the shared-memory weight broadcaster.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prl {

// Maps `size` bytes of `fd` (MAP_SHARED; read-write or read-only). With prefault, populates
// every page (MADV_POPULATE_WRITE / _READ, or touching each page on kernels before 5.14).
// `what` names the object in errors. Unmap with munmap(address, size).
absl::StatusOr<void*> MapShared(int fd, size_t size, bool writable, bool prefault,
                                absl::string_view what);

}  // namespace prl
