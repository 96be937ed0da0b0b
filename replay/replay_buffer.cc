#include "replay/replay_buffer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/futex.h"
#include "core/process_identity.h"
#include "core/shared_mapping.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "replay/rollout_group.h"
#include "replay/segment.h"
#include "replay/segment_check.h"

namespace prl {

namespace bip = boost::interprocess;
using replay_internal::FixedHeader;
using replay_internal::FrameHeader;
using replay_internal::Header;
using replay_internal::kFrameAlign;
using replay_internal::Segment;
using replay_internal::SteadyNowNs;

namespace replay_internal {
// The segment object (Boost.Interprocess) and its mapping. A writable mapping is prefaulted
// writable (MADV_POPULATE_WRITE): otherwise a process's first pass over the ring takes a fault
// per 4 KB page and, even prefaulted read-only, runs at half the memory bandwidth. A read-only
// mapping (Inspect) only reads the header and is not prefaulted.
struct Mapping {
  bip::shared_memory_object shm;
  void* address = nullptr;
  size_t size = 0;
  Segment segment{nullptr};

  absl::Status Map(bool writable) {
    bip::offset_t bytes = 0;
    shm.get_size(bytes);
    size = static_cast<size_t>(bytes);
    absl::StatusOr<void*> mapped =
        MapShared(shm.get_mapping_handle().handle, size, writable, /*prefault=*/writable,
                  absl::StrCat("replay segment '", shm.get_name(), "'"));
    if (!mapped.ok()) return mapped.status();
    address = *mapped;
    return absl::OkStatus();
  }
  ~Mapping() {
    if (address != nullptr) munmap(address, size);
  }
};
}  // namespace replay_internal

using replay_internal::Mapping;

namespace {

constexpr int64_t kWaitSliceNs = 10'000'000;  // waits re-check leases and dead writers this often

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t FixedChecksum(const FixedHeader& f) { return XXH3_64bits(&f, sizeof(f)); }

ReplayConfig ConfigOf(const FixedHeader& f) {
  ReplayConfig c;
  c.capacity_bytes = static_cast<int64_t>(f.data_bytes);
  c.max_groups = static_cast<int64_t>(f.queue_capacity);
  c.backpressure = static_cast<BackpressurePolicy>(f.backpressure);
  c.lease_ms = f.lease_ns / 1'000'000;
  c.max_leases = static_cast<int32_t>(f.max_leases);
  c.max_writers = static_cast<int32_t>(f.max_writers);
  c.label = std::string(f.label, strnlen(f.label, sizeof(f.label)));
  return c;
}

absl::Status ValidateConfig(const ReplayConfig& c) {
  auto bad = [](absl::string_view field, absl::string_view expected, int64_t found) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay config: ", field, " must be ", expected, ", found ", found));
  };
  if (c.capacity_bytes < (int64_t{1} << 16)) {
    return bad("capacity_bytes", ">= 65536", c.capacity_bytes);
  }
  if (c.max_groups < 0) return bad("max_groups", ">= 0 (0: capacity_bytes / 4096)", c.max_groups);
  if (c.lease_ms < 1) return bad("lease_ms", ">= 1", c.lease_ms);
  if (c.max_leases < 1 || c.max_leases > (1 << 20)) {
    return bad("max_leases", "in [1, 2^20]", c.max_leases);
  }
  if (c.max_writers < 1 || c.max_writers > (1 << 16)) {
    return bad("max_writers", "in [1, 65536]", c.max_writers);
  }
  if (c.label.size() >= sizeof(FixedHeader::label)) {
    return bad("label length", "< 128 bytes", static_cast<int64_t>(c.label.size()));
  }
  return absl::OkStatus();
}

absl::Status Interprocess(const bip::interprocess_exception& e, absl::string_view what,
                          const std::string& name) {
  const std::string message = absl::StrCat(what, " replay segment '", name, "': ", e.what());
  if (e.get_error_code() == bip::not_found_error) return absl::NotFoundError(message);
  if (e.get_error_code() == bip::already_exists_error) return absl::AlreadyExistsError(message);
  if (e.get_error_code() == bip::security_error) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// Maps an existing segment and checks that its header is one this build can use.
absl::StatusOr<std::unique_ptr<Mapping>> MapExisting(const std::string& name, bool writable) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name));
  auto m = std::make_unique<Mapping>();
  const bip::mode_t mode = writable ? bip::read_write : bip::read_only;
  try {
    m->shm = bip::shared_memory_object(bip::open_only, name.c_str(), mode);
    bip::offset_t size = 0;
    m->shm.get_size(size);
    if (static_cast<uint64_t>(size) < sizeof(Header)) {
      return absl::DataLossError(absl::StrCat("replay segment '", name, "' is ", size,
                                              " bytes, smaller than its header (", sizeof(Header),
                                              "): reset it"));
    }
  } catch (const bip::interprocess_exception& e) {
    return Interprocess(e, "cannot open", name);
  }
  PRL_RETURN_IF_ERROR(m->Map(writable));
  auto* base = static_cast<uint8_t*>(m->address);
  const Header& h = *reinterpret_cast<const Header*>(base);
  // The creator sets `initialized` last; give a concurrent creator a moment.
  for (int i = 0;
       i < 100 && h.initialized.load(std::memory_order_acquire) != replay_internal::kMagic; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const FixedHeader& f = h.fixed;
  if (f.magic != replay_internal::kMagic) {
    return absl::DataLossError(
        absl::StrCat("'", name, "' is not a prl replay segment (magic ", f.magic, "): reset it"));
  }
  if (f.layout_version != replay_internal::kLayoutVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("replay segment '", name, "' has layout version ", f.layout_version,
                     "; this prl reads ", replay_internal::kLayoutVersion,
                     ": drain it with the matching prl or `prl replay reset ", name, "`"));
  }
  if (h.fixed_checksum != FixedChecksum(f)) {
    return absl::DataLossError(absl::StrCat("replay segment '", name,
                                            "' has a corrupted header (checksum mismatch): "
                                            "`prl replay reset ",
                                            name, "`"));
  }
  if (f.segment_bytes != m->size) {
    return absl::FailedPreconditionError(absl::StrCat("replay segment '", name, "' is ", m->size,
                                                      " bytes but its header says ",
                                                      f.segment_bytes, ": reset it"));
  }
  if (h.initialized.load(std::memory_order_acquire) != replay_internal::kMagic) {
    return absl::UnavailableError(absl::StrCat("replay segment '", name,
                                               "' was never fully created (its creator died while "
                                               "creating it?): `prl replay reset ",
                                               name, "`"));
  }
  // The checksum says the creator wrote this header; the ranges say a creator of this layout
  // could have (replay/segment_check.h).
  PRL_RETURN_IF_ERROR(replay_internal::CheckFixedHeader(f, m->size, name));
  if (const std::string bad = CheckUndoLog(h.lock, m->size); !bad.empty()) {
    return absl::DataLossError(absl::StrCat("replay segment '", name, "' is damaged: ", bad,
                                            "; `prl replay reset ", name, "` removes it"));
  }
  m->segment = Segment(base, m->size);
  return m;
}

// A segment being made is a draft named `<name>.creating.<pid>` (ReplayBuffer::Create).
constexpr char kDraftInfix[] = ".creating.";

std::string ShmPath(const std::string& name) { return absl::StrCat("/dev/shm/", name); }

// Removes the drafts of `name` whose makers died before publishing them.
void RemoveAbandonedDrafts(const std::string& name) {
  const std::string prefix = absl::StrCat(name, kDraftInfix);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with(prefix)) continue;
    const std::string pid = file.substr(prefix.size());
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit) || pid.size() > 9) continue;
    if (kill(static_cast<pid_t>(std::stoi(pid)), 0) != 0 && errno == ESRCH) {
      bip::shared_memory_object::remove(file.c_str());
    }
  }
}

// /dev/shm must hold the whole segment: tmpfs pages are allocated on first touch, and a touch
// that finds the file system full is a SIGBUS, not an error.
absl::Status CheckShmSpace(const std::string& name, uint64_t segment_bytes) {
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) != 0) return absl::OkStatus();  // not Linux's tmpfs: let it try
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (segment_bytes <= free_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "replay segment '", name, "' needs ", segment_bytes, " bytes but /dev/shm has ", free_bytes,
      " bytes free (of ", static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize,
      "): lower the capacity (replay.capacity_mb), free /dev/shm, or enlarge it (a container's "
      "--shm-size)"));
}

ReplayStats StatsOf(const Segment& s) {
  const Header& h = s.header();
  const auto& c = h.counters;
  ReplayStats r;
  auto v = [](const replay_internal::A64& a) { return static_cast<int64_t>(a.load()); };
  r.capacity_bytes = static_cast<int64_t>(h.fixed.data_bytes);
  r.used_bytes = v(h.head) - v(h.tail);
  r.groups_ready = static_cast<int64_t>(s.QueueSize());
  r.groups_leased = v(h.leased);
  r.writes_in_progress = v(h.writing);
  r.groups_in = v(c.groups_in);
  r.records_in = v(c.records_in);
  r.bytes_in = v(c.bytes_in);
  r.groups_out = v(c.groups_out);
  r.records_out = v(c.records_out);
  r.bytes_out = v(c.bytes_out);
  r.dropped_stale = v(c.dropped_stale);
  r.dropped_full = v(c.dropped_full);
  r.redelivered = v(c.redelivered);
  r.abandoned_writes = v(c.abandoned_writes);
  r.writer_waits = v(c.writer_waits);
  r.write_timeouts = v(c.write_timeouts);
  r.reader_waits = v(c.reader_waits);
  r.lock_takeovers = v(h.lock.takeovers);
  r.dropped_prompts_waiting = v(h.dropped.next) - v(h.dropped.handed);
  r.dropped_prompts_overwritten = v(h.dropped.overwritten);
  return r;
}

}  // namespace

absl::Status ValidateSegmentName(const std::string& name) {
  const bool ok =
      !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "replay segment name '", name, "': expected 1 to 200 characters of [A-Za-z0-9._-]"));
}

ReplayBuffer::ReplayBuffer(std::string name, std::unique_ptr<Mapping> mapping)
    : name_(std::move(name)), mapping_(std::move(mapping)) {}

ReplayBuffer::~ReplayBuffer() = default;

absl::StatusOr<std::unique_ptr<ReplayBuffer>> ReplayBuffer::Create(const std::string& name,
                                                                   const ReplayConfig& config,
                                                                   bool reclaim_stale) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name));
  PRL_RETURN_IF_ERROR(ValidateConfig(config));
  const uint64_t data_bytes = AlignUp(static_cast<uint64_t>(config.capacity_bytes), kFrameAlign);
  const uint64_t queue_capacity = config.max_groups > 0
                                      ? static_cast<uint64_t>(config.max_groups)
                                      : std::max<uint64_t>(1024, data_bytes / 4096);
  FixedHeader f{};
  f.magic = replay_internal::kMagic;
  f.layout_version = replay_internal::kLayoutVersion;
  f.backpressure = static_cast<uint32_t>(config.backpressure);
  f.queue_offset = AlignUp(sizeof(Header), 4096);
  f.queue_capacity = queue_capacity;
  f.lease_offset = AlignUp(f.queue_offset + queue_capacity * 8, 4096);
  f.max_leases = static_cast<uint64_t>(config.max_leases);
  f.writer_offset =
      AlignUp(f.lease_offset + f.max_leases * sizeof(replay_internal::LeaseSlot), 4096);
  f.max_writers = static_cast<uint64_t>(config.max_writers);
  f.data_offset =
      AlignUp(f.writer_offset + f.max_writers * sizeof(replay_internal::WriterSlot), 4096);
  f.data_bytes = data_bytes;
  f.segment_bytes = f.data_offset + data_bytes;
  f.lease_ns = config.lease_ms * 1'000'000;
  f.creator_token = SelfProcessToken();
  f.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::memcpy(f.label, config.label.data(), config.label.size());

  const auto already_exists = [&]() -> absl::Status {
    absl::StatusOr<SegmentInfo> info = Inspect(name);
    const bool stale = info.ok() ? !info->creator_alive : true;
    if (reclaim_stale && stale) {
      bip::shared_memory_object::remove(name.c_str());
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "replay segment '", name, "' already exists",
        info.ok() ? absl::StrCat(" (created by pid ", info->creator_pid, ", which is ",
                                 info->creator_alive ? "running)" : "dead: a stale segment)")
                  : absl::StrCat(" (unreadable: ", info.status().message(), ")"),
        "; `prl replay reset ", name, "` removes it",
        stale ? ", or `prl replay create --reclaim-stale` (reclaim_stale) replaces it" : ""));
  };
  std::error_code error;
  if (std::filesystem::exists(ShmPath(name), error)) PRL_RETURN_IF_ERROR(already_exists());
  // Made whole under a name of this process's, then published under `name` at once (link), so
  // that an opener never finds the segment half made (empty, or without its header).
  RemoveAbandonedDrafts(name);
  const std::string draft = absl::StrCat(name, kDraftInfix, getpid());
  bip::shared_memory_object::remove(draft.c_str());  // a dead process's of this pid
  auto m = std::make_unique<Mapping>();
  try {
    m->shm = bip::shared_memory_object(bip::create_only, draft.c_str(), bip::read_write,
                                       bip::permissions(0600));
  } catch (const bip::interprocess_exception& e) {
    return Interprocess(e, "cannot create", name);
  }
  const auto fail = [&](absl::Status s) {
    bip::shared_memory_object::remove(draft.c_str());
    return s;
  };
  if (absl::Status space = CheckShmSpace(name, f.segment_bytes); !space.ok()) return fail(space);
  try {
    m->shm.truncate(static_cast<bip::offset_t>(f.segment_bytes));
  } catch (const bip::interprocess_exception& e) {
    return fail(Interprocess(e, "cannot size", name));
  }
  // Every page allocated now: a full /dev/shm is this error, never a SIGBUS later.
  if (const int err = posix_fallocate(m->shm.get_mapping_handle().handle, 0,
                                      static_cast<off_t>(f.segment_bytes));
      err != 0) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("replay segment '", name, "': cannot allocate its ", f.segment_bytes,
                     " bytes in /dev/shm: ", std::strerror(err))));
  }
  if (absl::Status mapped = m->Map(/*writable=*/true); !mapped.ok()) return fail(mapped);
  auto* base = static_cast<uint8_t*>(m->address);
  Header* h = new (base) Header();  // the pages are zero; construct the atomics
  h->fixed = f;
  h->fixed_checksum = FixedChecksum(f);
  h->initialized.store(replay_internal::kMagic, std::memory_order_release);
  m->segment = Segment(base, m->size);
  if (link(ShmPath(draft).c_str(), ShmPath(name).c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST) {  // made meanwhile by another process
      return fail(absl::AlreadyExistsError(absl::StrCat(
          "replay segment '", name, "' already exists (made by another process meanwhile); "
          "`prl replay reset ", name, "` removes it")));
    }
    return fail(absl::InternalError(absl::StrCat("cannot publish replay segment '", name,
                                                 "': ", std::strerror(err))));
  }
  bip::shared_memory_object::remove(draft.c_str());
  return std::unique_ptr<ReplayBuffer>(new ReplayBuffer(name, std::move(m)));
}

absl::StatusOr<std::unique_ptr<ReplayBuffer>> ReplayBuffer::Open(const std::string& name) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Mapping> m, MapExisting(name, /*writable=*/true));
  {
    // Under the lock (which first rolls back a dead holder's half-done section), the ring,
    // queue and slots must agree before this process relies on them.
    Segment& s = m->segment;
    LockedSection lock(&s.header().lock, s.base(), s.mapped_bytes());
    PRL_RETURN_IF_ERROR(replay_internal::CheckState(s, name));
  }
  return std::unique_ptr<ReplayBuffer>(new ReplayBuffer(name, std::move(m)));
}

absl::StatusOr<SegmentInfo> ReplayBuffer::Inspect(const std::string& name) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Mapping> m, MapExisting(name, /*writable=*/false));
  const Header& h = m->segment.header();
  SegmentInfo info;
  info.name = name;
  info.layout_version = h.fixed.layout_version;
  info.config = ConfigOf(h.fixed);
  info.label = info.config.label;
  info.creator_pid = TokenPid(h.fixed.creator_token);
  info.creator_alive = ProcessAlive(h.fixed.creator_token);
  info.created_unix_ns = h.fixed.created_unix_ns;
  info.stats = StatsOf(m->segment);
  return info;
}

absl::Status ReplayBuffer::Remove(const std::string& name, bool force) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name));
  absl::StatusOr<SegmentInfo> info = Inspect(name);
  if (info.status().code() == absl::StatusCode::kNotFound) return info.status();
  if (info.ok() && info->creator_alive && !force) {
    return absl::FailedPreconditionError(
        absl::StrCat("replay segment '", name, "' belongs to a running job (creator pid ",
                     info->creator_pid, " is alive); stop it first, or force the removal"));
  }
  if (!bip::shared_memory_object::remove(name.c_str())) {
    return absl::InternalError(absl::StrCat("could not remove replay segment '", name, "'"));
  }
  return absl::OkStatus();
}

absl::Status ReplayBuffer::WaitFor(std::atomic<uint32_t>* word, uint32_t seen,
                                   int64_t deadline_ns) {
  FutexWait(word, seen, std::min(kWaitSliceNs, deadline_ns - SteadyNowNs()));
  return absl::OkStatus();
}

absl::Status ReplayBuffer::WriteGroup(absl::Span<const RolloutRecord> records,
                                      absl::Duration timeout) {
  // The per-element value scans run inside the encode, on cache-hot bytes.
  PRL_ASSIGN_OR_RETURN(const GroupInfo info, DescribeGroup(records, /*scan_values=*/false));
  Segment& s = mapping_->segment;
  Header& h = s.header();
  const uint64_t frame_bytes = AlignUp(sizeof(FrameHeader) + info.payload_bytes, kFrameAlign);
  if (frame_bytes > h.fixed.data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group of ", info.size, " records takes ", frame_bytes, " bytes, more than replay buffer '",
        name_, "' holds (", h.fixed.data_bytes, " bytes)"));
  }
  const int64_t start = SteadyNowNs();
  const int64_t deadline = start + absl::ToInt64Nanoseconds(timeout);
  Segment::Allocation a;
  Segment::FramePrompt prompt;  // kept in the frame: a dropped group's prompt is handed back
  prompt.index = records.empty() ? 0 : records[0].prompt_index;
  if (!records.empty() && !records[0].prompt_set_id.empty() &&
      records[0].prompt_set_id.size() <= sizeof(prompt.set_id)) {
    std::memcpy(prompt.set_id, records[0].prompt_set_id.data(), records[0].prompt_set_id.size());
  }
  for (bool waited = false;;) {
    uint32_t seen;
    bool reclaimed = false;
    {
      LockedSection lock(&h.lock, s.base(), s.mapped_bytes());
      reclaimed = s.Maintain(lock, /*force=*/waited);
      const replay_internal::Step step =
          s.TryAllocate(lock, frame_bytes, info.payload_bytes, info.key, info.size, prompt, &a);
      if (step == replay_internal::Step::kDone) break;
      if (step == replay_internal::Step::kYield) continue;  // dropped some; go on at once
      seen = h.space_futex.load(std::memory_order_acquire);
      if (!waited) lock.Add(h.counters.writer_waits, 1);
      if (SteadyNowNs() >= deadline) {
        lock.Add(h.counters.write_timeouts, 1);
        const ReplayStats st = StatsOf(s);
        return absl::ResourceExhaustedError(absl::StrCat(
            "replay buffer '", name_, "' is full: waited ", (SteadyNowNs() - start) / 1'000'000,
            " ms for ", frame_bytes, " bytes (", st.used_bytes, " of ", st.capacity_bytes,
            " bytes used; ", st.groups_ready, " groups ready, ", st.groups_leased, " leased)"));
      }
    }
    if (reclaimed) FutexBumpAndWake(&h.space_futex);
    waited = true;
    PRL_RETURN_IF_ERROR(WaitFor(&h.space_futex, seen, deadline));
  }
  const absl::StatusOr<EncodedGroup> encoded =
      EncodeGroupToWithChecksum(records, s.Payload(a.position));
  {
    LockedSection lock(&h.lock, s.base(), s.mapped_bytes());
    if (!encoded.ok()) {
      s.Abort(lock, a);
    } else {
      s.Commit(lock, a, encoded->checksum, encoded->min_version);
    }
  }
  if (!encoded.ok()) {
    FutexBumpAndWake(&h.space_futex);
    return encoded.status();
  }
  FutexBumpAndWake(&h.data_futex);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LeasedGroup>> ReplayBuffer::Take(const TakeOptions& options) {
  if (options.max_groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Take: max_groups must be >= 1, found ", options.max_groups));
  }
  if (options.max_lag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Take: max_lag must be >= 0, found ", options.max_lag));
  }
  Segment& s = mapping_->segment;
  Header& h = s.header();
  const int64_t deadline = SteadyNowNs() + absl::ToInt64Nanoseconds(options.timeout);
  std::vector<LeasedGroup> out;
  for (bool waited = false;;) {
    uint32_t seen;
    bool reclaimed = false;
    replay_internal::Step step = replay_internal::Step::kNone;
    {
      LockedSection lock(&h.lock, s.base(), s.mapped_bytes());
      reclaimed = s.Maintain(lock, /*force=*/waited || options.reclaim_first);
      Segment::LeaseGrant lease;
      const uint64_t tail_before = h.tail.load();
      while (static_cast<int32_t>(out.size()) < options.max_groups &&
             (step = s.TryLease(lock, options.learner_version, options.max_lag, &lease)) ==
                 replay_internal::Step::kDone) {
        const FrameHeader& fh = s.Frame(lease.position);
        LeasedGroup g;
        g.frame_position = lease.position;
        g.lease_slot = static_cast<uint32_t>(lease.slot);
        g.lease_generation = lease.generation;
        g.group_key = fh.group_key.load();
        g.num_records = static_cast<uint32_t>(fh.num_records.load());
        g.min_version = static_cast<int64_t>(fh.min_version.load());
        g.checksum = fh.checksum.load();
        g.payload = absl::Span<const uint8_t>(s.Payload(lease.position), fh.payload_bytes.load());
        out.push_back(g);
      }
      reclaimed |= s.ReclaimTail(lock) > 0 || h.tail.load() != tail_before;
      seen = h.data_futex.load(std::memory_order_acquire);
      if (out.empty() && !waited) lock.Add(h.counters.reader_waits, 1);
    }
    if (reclaimed) FutexBumpAndWake(&h.space_futex);
    if (step == replay_internal::Step::kYield) continue;  // the section's budget: a new one
    if (!out.empty() || SteadyNowNs() >= deadline) return out;
    waited = true;
    PRL_RETURN_IF_ERROR(WaitFor(&h.data_futex, seen, deadline));
  }
}

absl::Status ReplayBuffer::Ack(const LeasedGroup& group) {
  Segment& s = mapping_->segment;
  Header& h = s.header();
  bool ok;
  {
    LockedSection lock(&h.lock, s.base(), s.mapped_bytes());
    ok = s.EndLease(lock, group.frame_position, group.lease_slot, group.lease_generation,
                    /*consumed=*/true);
  }
  if (!ok) {
    return absl::FailedPreconditionError(
        absl::StrCat("replay lease on group at ", group.frame_position,
                     " was lost (it expired or was "
                     "released, and the group was re-delivered): discard what was read from it"));
  }
  FutexBumpAndWake(&h.space_futex);
  return absl::OkStatus();
}

absl::Status ReplayBuffer::Renew(const LeasedGroup& group) {
  Segment& s = mapping_->segment;
  bool ok;
  {
    LockedSection lock(&s.header().lock, s.base(), s.mapped_bytes());
    ok = s.RenewLease(lock, group.frame_position, group.lease_slot, group.lease_generation);
  }
  if (!ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replay lease on group at ", group.frame_position,
        " was lost before it was renewed (it expired or was released, and the group was "
        "re-delivered): discard what was read from it"));
  }
  return absl::OkStatus();
}

absl::Status ReplayBuffer::Release(const LeasedGroup& group) {
  Segment& s = mapping_->segment;
  Header& h = s.header();
  bool ok;
  {
    LockedSection lock(&h.lock, s.base(), s.mapped_bytes());
    ok = s.EndLease(lock, group.frame_position, group.lease_slot, group.lease_generation,
                    /*consumed=*/false);
  }
  if (!ok) {
    return absl::FailedPreconditionError(
        absl::StrCat("replay lease on group at ", group.frame_position, " was already lost"));
  }
  FutexBumpAndWake(&h.data_futex);
  return absl::OkStatus();
}

std::vector<DroppedPrompt> ReplayBuffer::DroppedPrompts(size_t max, uint64_t* through) const {
  Segment& s = mapping_->segment;
  std::vector<Segment::FramePrompt> dropped;
  {  // under the lock: a writer may be adding an entry
    LockedSection lock(&s.header().lock, s.base(), s.mapped_bytes());
    dropped = s.DroppedPrompts(max, through);
  }
  std::vector<DroppedPrompt> out;
  for (const Segment::FramePrompt& p : dropped) {
    const char* bytes = reinterpret_cast<const char*>(p.set_id);
    out.push_back({std::string(bytes, strnlen(bytes, sizeof(p.set_id))), p.index});
  }
  return out;
}

void ReplayBuffer::ForgetDroppedPrompts(uint64_t through) {
  Segment& s = mapping_->segment;
  LockedSection lock(&s.header().lock, s.base(), s.mapped_bytes());
  s.ForgetDroppedPrompts(lock, through);
}

ReplayStats ReplayBuffer::Stats() const { return StatsOf(mapping_->segment); }

bool LeasedGroup::VerifyChecksum() const {
  return XXH3_64bits(payload.data(), payload.size()) == checksum;
}

absl::StatusOr<std::vector<RolloutRecord>> LeasedGroup::Decode() const {
  if (!VerifyChecksum()) {
    return absl::DataLossError(absl::StrCat("replay group at ", frame_position,
                                            " fails its checksum: its lease was lost and the "
                                            "space reused; discard it"));
  }
  return DecodeGroup(payload);
}

}  // namespace prl
