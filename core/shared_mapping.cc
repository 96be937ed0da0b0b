#include "core/shared_mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace prl {

absl::StatusOr<void*> MapShared(int fd, size_t size, bool writable, bool prefault,
                                absl::string_view what) {
  void* address =
      mmap(nullptr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("cannot map ", what, " (", size, " bytes): ", std::strerror(errno)));
  }
  if (prefault &&
      madvise(address, size, writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0) {
    const long page = sysconf(_SC_PAGESIZE);
    for (size_t at = 0; at < size; at += static_cast<size_t>(page)) {
      auto* p = static_cast<volatile uint8_t*>(address) + at;
      if (writable) {
        *p = *p;
      } else {
        (void)*p;
      }
    }
  }
  return address;
}

}  // namespace prl
