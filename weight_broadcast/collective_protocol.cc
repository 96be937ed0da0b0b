#include "weight_broadcast/collective_protocol.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/buffer.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"

namespace prl::weight_broadcast_internal {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the broadcast header is little-endian: a big-endian host needs byte swaps");

constexpr uint64_t kHeaderMagic = 0x3130434257524c50ull;  // "PRLWBC01"
// A CUDA payload is hashed through host memory this many bytes at a time.
constexpr size_t kChecksumChunkBytes = size_t{16} << 20;

struct RawHeader {
  uint64_t magic;
  uint32_t kind;
  uint32_t reserved;
  int64_t epoch;
  int64_t version;
  uint64_t bytes;
  uint64_t checksum;
  uint64_t pad[2];
};
static_assert(sizeof(RawHeader) == kWireHeaderBytes);

// "k1=v1 k2=v2 ...": the values by key.
absl::flat_hash_map<absl::string_view, absl::string_view> Fields(absl::string_view text) {
  absl::flat_hash_map<absl::string_view, absl::string_view> fields;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(word, absl::MaxSplits('=', 1));
    fields[kv.first] = kv.second;
  }
  return fields;
}

absl::Status Unreadable(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::DataLossError(
      absl::StrCat("unreadable ", what, " (", why, "): '", text.substr(0, 200), "'"));
}

// Reads fields[key] into *out: a decimal integer, or hexadecimal with `hex`.
template <typename T>
bool ReadField(const absl::flat_hash_map<absl::string_view, absl::string_view>& fields,
               absl::string_view key, T* out, bool hex = false) {
  auto it = fields.find(key);
  if (it == fields.end()) return false;
  if (hex) {
    uint64_t value = 0;
    if (!absl::SimpleHexAtoi(it->second, &value)) return false;
    *out = static_cast<T>(value);
    return true;
  }
  return absl::SimpleAtoi(it->second, out);
}

std::string Hex(uint64_t id) { return absl::StrCat(absl::Hex(id, absl::kZeroPad16)); }

}  // namespace

std::string EpochGroupName(int64_t epoch) { return absl::StrCat(kEpochKey, "/", epoch); }

std::string CollectiveDataPath(Device device) {
  return device.is_cuda() ? "nccl (cuda)" : "gloo (cpu)";
}

uint64_t RandomId() {
  std::random_device rd;
  const uint64_t id = (uint64_t{rd()} << 32) ^ rd();
  return id == 0 ? 1 : id;
}

std::string EncodeHello(const Hello& hello) {
  return absl::StrCat("instance=", Hex(hello.instance),
                      " keepalive_ms=", absl::ToInt64Milliseconds(hello.keepalive), "\n",
                      EncodeHandshake(hello.handshake));
}

absl::StatusOr<Hello> DecodeHello(absl::string_view text, absl::string_view where) {
  const std::pair<absl::string_view, absl::string_view> lines =
      absl::StrSplit(text, absl::MaxSplits('\n', 1));
  const auto fields = Fields(lines.first);
  Hello hello;
  int64_t keepalive_ms = 0;
  if (!ReadField(fields, "instance", &hello.instance, /*hex=*/true) ||
      !ReadField(fields, "keepalive_ms", &keepalive_ms)) {
    return Unreadable(absl::StrCat(where, ": publisher hello"), text,
                      "expected instance= and keepalive_ms=");
  }
  hello.keepalive = absl::Milliseconds(keepalive_ms);
  PRL_ASSIGN_OR_RETURN(hello.handshake, DecodeHandshake(lines.second, where));
  return hello;
}

std::string EncodeAnnouncement(const Announcement& a) {
  return absl::StrCat("instance=", Hex(a.instance), " beat=", a.beat, " epoch=", a.epoch,
                      " version=", a.version, " host=", a.host);
}

absl::StatusOr<Announcement> DecodeAnnouncement(absl::string_view text) {
  const auto fields = Fields(text);
  Announcement a;
  if (!ReadField(fields, "instance", &a.instance, /*hex=*/true) ||
      !ReadField(fields, "beat", &a.beat) || !ReadField(fields, "epoch", &a.epoch) ||
      !ReadField(fields, "version", &a.version) || !fields.contains("host")) {
    return Unreadable("member announcement", text,
                      "expected instance=, beat=, epoch=, version= and host=");
  }
  a.host = std::string(fields.at("host"));
  return a;
}

std::string EncodeEpoch(const EpochRecord& e) {
  return absl::StrCat("instance=", Hex(e.instance), " epoch=", e.epoch,
                      " members=", absl::StrJoin(e.members, ","));
}

absl::StatusOr<EpochRecord> DecodeEpoch(absl::string_view text) {
  const auto fields = Fields(text);
  EpochRecord e;
  if (!ReadField(fields, "instance", &e.instance, /*hex=*/true) ||
      !ReadField(fields, "epoch", &e.epoch) || !fields.contains("members")) {
    return Unreadable("epoch record", text, "expected instance=, epoch= and members=");
  }
  e.members = absl::StrSplit(fields.at("members"), ',', absl::SkipEmpty());
  return e;
}

int RankOf(const EpochRecord& e, absl::string_view id) {
  const auto it = std::find(e.members.begin(), e.members.end(), id);
  return it == e.members.end() ? 0 : static_cast<int>(it - e.members.begin()) + 1;
}

std::array<uint8_t, kWireHeaderBytes> EncodeHeader(const WireHeader& h) {
  RawHeader raw{};
  raw.magic = kHeaderMagic;
  raw.kind = static_cast<uint32_t>(h.kind);
  raw.epoch = h.epoch;
  raw.version = h.version;
  raw.bytes = h.bytes;
  raw.checksum = h.checksum;
  std::array<uint8_t, kWireHeaderBytes> bytes;
  std::memcpy(bytes.data(), &raw, sizeof(raw));
  return bytes;
}

absl::StatusOr<WireHeader> DecodeHeader(const std::array<uint8_t, kWireHeaderBytes>& bytes,
                                        int64_t epoch) {
  RawHeader raw;
  std::memcpy(&raw, bytes.data(), sizeof(raw));
  if (raw.magic != kHeaderMagic || raw.kind < 1 || raw.kind > 3) {
    return absl::DataLossError(absl::StrCat("weight broadcast: not a header (magic ",
                                            absl::Hex(raw.magic), ", kind ", raw.kind, ")"));
  }
  if (raw.epoch != epoch) {
    return absl::DataLossError(absl::StrCat("weight broadcast: a header of epoch ", raw.epoch,
                                            " arrived in epoch ", epoch));
  }
  WireHeader h;
  h.kind = static_cast<HeaderKind>(raw.kind);
  h.epoch = raw.epoch;
  h.version = raw.version;
  h.bytes = raw.bytes;
  h.checksum = raw.checksum;
  return h;
}

absl::StatusOr<uint64_t> PayloadChecksum(const void* data, Device device, size_t bytes) {
  if (device.is_cpu()) return XXH3_64bits(data, bytes);
  std::vector<uint8_t> staging(std::min(bytes, kChecksumChunkBytes));
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t offset = 0; offset < bytes; offset += staging.size()) {
    const size_t n = std::min(staging.size(), bytes - offset);
    PRL_RETURN_IF_ERROR(CopyBytes(staging.data(), Device::Cpu(),
                                  static_cast<const uint8_t*>(data) + offset, device, n));
    XXH3_64bits_update(&state, staging.data(), n);
  }
  return XXH3_64bits_digest(&state);
}

// ---- MemberTable ----------------------------------------------------------------------------

std::vector<std::string> MemberTable::Refresh(
    const std::vector<std::pair<std::string, std::string>>& keys, absl::Time now) {
  std::map<std::string, Member> seen;
  std::vector<std::string> expired;
  for (const auto& [key, value] : keys) {
    if (!absl::StartsWith(key, kMemberPrefix)) continue;
    const std::string id = key.substr(kMemberPrefix.size());
    absl::StatusOr<Announcement> said = DecodeAnnouncement(value);
    if (!said.ok()) continue;  // not one of ours: ignored
    auto old = members_.find(id);
    Member m;
    if (old != members_.end()) m = old->second;
    if (old == members_.end() || m.said.beat != said->beat) m.changed = now;
    m.said = *std::move(said);
    m.expired = now - m.changed > member_timeout_;
    if (m.expired) expired.push_back(id);
    seen.emplace(id, std::move(m));
  }
  members_ = std::move(seen);
  return expired;
}

bool MemberTable::IsAvailable(const Member& m) const {
  return !m.expired && m.said.instance == instance_ && m.said.epoch >= m.assigned;
}

std::vector<std::string> MemberTable::Available() const {
  std::vector<std::string> ids;
  for (const auto& [id, m] : members_) {
    if (IsAvailable(m)) ids.push_back(id);
  }
  return ids;
}

bool MemberTable::HasNewcomer(const std::vector<std::string>& epoch_members) const {
  for (const std::string& id : Available()) {
    if (std::find(epoch_members.begin(), epoch_members.end(), id) == epoch_members.end()) {
      return true;
    }
  }
  return false;
}

bool MemberTable::AnyExpired(const std::vector<std::string>& members) const {
  for (const std::string& id : members) {
    auto it = members_.find(id);
    if (it != members_.end() && it->second.expired) return true;
  }
  return false;
}

bool MemberTable::AnyLeft(const std::vector<std::string>& members) const {
  for (const std::string& id : members) {
    if (!members_.contains(id)) return true;
  }
  return false;
}

void MemberTable::Assign(const std::vector<std::string>& members, int64_t epoch) {
  for (const std::string& id : members) {
    auto it = members_.find(id);
    if (it != members_.end()) it->second.assigned = epoch;
  }
}

void MemberTable::Ended(const std::vector<std::string>& members, absl::Time now) {
  ended_members_ = members;
  ended_at_ = now;
}

bool MemberTable::ReadyToForm(absl::Time now, absl::Duration grace) const {
  if (now >= ended_at_ + grace) return true;
  for (const std::string& id : ended_members_) {
    auto it = members_.find(id);
    if (it != members_.end() && !it->second.expired && !IsAvailable(it->second)) return false;
  }
  return true;
}

std::string MemberTable::HostOf(const std::string& id) const {
  auto it = members_.find(id);
  return it == members_.end() ? "" : it->second.said.host;
}

int64_t MemberTable::NewestReportedVersion() const {
  int64_t newest = -1;
  for (const auto& [id, m] : members_) {
    if (!m.expired) newest = std::max(newest, m.said.version);
  }
  return newest;
}

}  // namespace prl::weight_broadcast_internal
