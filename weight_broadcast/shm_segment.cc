#include "weight_broadcast/shm_segment.h"

#include <sys/mman.h>

#include <algorithm>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cctype>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/process_identity.h"
#include "core/shared_mapping.h"
#include "core/status_macros.h"

namespace prl::weight_broadcast_internal {

namespace bip = boost::interprocess;

namespace {

absl::Status Interprocess(const bip::interprocess_exception& e, absl::string_view what,
                          const std::string& name, const SegmentKind& kind) {
  const std::string message = absl::StrCat(what, " ", kind.noun, " '", name, "': ", e.what());
  if (e.get_error_code() == bip::not_found_error) return absl::NotFoundError(message);
  if (e.get_error_code() == bip::already_exists_error) return absl::AlreadyExistsError(message);
  if (e.get_error_code() == bip::security_error) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// Maps the whole of `shm` (prefaulted with `populate`).
absl::StatusOr<std::pair<void*, size_t>> MapWhole(const bip::shared_memory_object& shm,
                                                  bool writable, bool populate,
                                                  const SegmentKind& kind) {
  bip::offset_t bytes = 0;
  shm.get_size(bytes);
  const auto size = static_cast<size_t>(bytes);
  PRL_ASSIGN_OR_RETURN(void* address,
                       MapShared(shm.get_mapping_handle().handle, size, writable, populate,
                                 absl::StrCat(kind.noun, " '", shm.get_name(), "'")));
  return std::make_pair(address, size);
}

}  // namespace

absl::Status ValidateSegmentName(const std::string& name, const SegmentKind& kind) {
  const bool ok =
      !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      kind.noun, " name '", name, "': expected 1 to 200 characters of [A-Za-z0-9._-]"));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(const std::string& name,
                                                                     uint64_t bytes,
                                                                     const SegmentKind& kind) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name, kind));
  bip::shared_memory_object shm;
  try {
    shm = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write,
                                    bip::permissions(0600));
    shm.truncate(static_cast<bip::offset_t>(bytes));
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() != bip::already_exists_error) {
      bip::shared_memory_object::remove(name.c_str());
    }
    return Interprocess(e, "cannot create", name, kind);
  }
  absl::StatusOr<std::pair<void*, size_t>> mapped =
      MapWhole(shm, /*writable=*/true, /*populate=*/true, kind);
  if (!mapped.ok()) {
    bip::shared_memory_object::remove(name.c_str());
    return mapped.status();
  }
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, mapped->first, mapped->second));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Open(const std::string& name,
                                                                   bool writable, bool populate,
                                                                   const SegmentKind& kind) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name, kind));
  bip::shared_memory_object shm;
  try {
    shm = bip::shared_memory_object(bip::open_only, name.c_str(),
                                    writable ? bip::read_write : bip::read_only);
    bip::offset_t size = 0;
    shm.get_size(size);
    if (static_cast<uint64_t>(size) < kind.header_bytes) {
      return absl::UnavailableError(absl::StrCat(
          kind.noun, " '", name, "' is ", size, " bytes, smaller than its header (",
          kind.header_bytes, "): being created, or its creator died while creating it (then ",
          "remove it: ", kind.remove_hint, name, ")"));
    }
  } catch (const bip::interprocess_exception& e) {
    return Interprocess(e, "cannot open", name, kind);
  }
  PRL_ASSIGN_OR_RETURN(auto mapped, MapWhole(shm, writable, populate, kind));
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, mapped.first, mapped.second));
}

SharedSegment::~SharedSegment() {
  if (address_ != nullptr) munmap(address_, size_);
}

absl::Status RemoveSegment(const std::string& name, const SegmentKind& kind) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name, kind));
  if (!bip::shared_memory_object::remove(name.c_str())) {
    return absl::NotFoundError(
        absl::StrCat("cannot remove ", kind.noun, " '", name, "': it does not exist"));
  }
  return absl::OkStatus();
}

void WaitUntilInitialized(const std::atomic<uint64_t>& initialized, uint64_t magic) {
  for (int i = 0; i < 100 && initialized.load(std::memory_order_acquire) != magic; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::Status CheckPreamble(const SegmentPreamble& p, size_t mapped_bytes, const std::string& name,
                           const SegmentKind& kind) {
  const std::string remove = absl::StrCat("remove it: ", kind.remove_hint, name);
  if (p.magic != kind.magic) {
    return absl::DataLossError(absl::StrCat("'", name, "' is not a prl ", kind.noun, " (magic ",
                                            absl::Hex(p.magic), ", expected ",
                                            absl::Hex(kind.magic), "): ", remove));
  }
  if (p.layout_version != kind.layout_version) {
    return absl::FailedPreconditionError(absl::StrCat(
        kind.noun, " '", name, "' has layout version ", p.layout_version, "; this prl reads ",
        kind.layout_version,
        ": restart the publisher with this prl after removing it: ", kind.remove_hint, name));
  }
  if (!p.checksum_ok) {
    return absl::DataLossError(absl::StrCat(
        kind.noun, " '", name, "' has a corrupted header (checksum mismatch): ", remove));
  }
  if (p.segment_bytes != mapped_bytes) {
    return absl::DataLossError(absl::StrCat(kind.noun, " '", name, "' is ", mapped_bytes,
                                            " bytes but its header says ", p.segment_bytes, ": ",
                                            remove));
  }
  if (!p.initialized) {
    return absl::UnavailableError(absl::StrCat(kind.noun, " '", name,
                                               "' was never fully created (its creator died "
                                               "while creating it?): ",
                                               remove));
  }
  return absl::OkStatus();
}

absl::Status ClaimPublisher(std::atomic<uint64_t>& publisher, const std::string& name,
                            const SegmentKind& kind) {
  for (;;) {
    uint64_t holder = publisher.load(std::memory_order_acquire);
    if (holder != 0 && ProcessAlive(holder)) {
      return absl::AlreadyExistsError(absl::StrCat(
          kind.noun, " '", name, "' already has a live publisher (pid ", TokenPid(holder),
          "): one learner publishes per segment; stop it, or pick another segment name"));
    }
    if (publisher.compare_exchange_strong(holder, SelfProcessToken(), std::memory_order_acq_rel)) {
      return absl::OkStatus();
    }
  }
}

void ReleasePublisher(std::atomic<uint64_t>& publisher) {
  uint64_t self = SelfProcessToken();
  publisher.compare_exchange_strong(self, 0, std::memory_order_acq_rel);
}

}  // namespace prl::weight_broadcast_internal
