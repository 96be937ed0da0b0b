// The nccl weight transport's protocol (internal to weight_broadcast/; see
// collective_transport.h for the picture): what the publisher and its subscribers write in the
// publisher's rendezvous store, the header at the head of every broadcast, the payload
// checksum, and the publisher's view of its members. No network I/O here: CPU-tested alone.
//
// Store keys:
//   prl/weights/hello         the publisher: its instance id (new for every publisher), its
//                             keepalive interval and its handshake (handshake.h);
//   prl/weights/member/<id>   a subscriber's announcement, rewritten every heartbeat: the
//                             instance it talks to, a beat counter, the last epoch it finished
//                             with, the newest version it holds, the address it is reached at;
//   prl/weights/epoch         the current epoch: instance, number, members in rank order (the
//                             publisher is rank 0, members[i] is rank i + 1);
//   prl/weights/epoch/<n>/... the communicator rendezvous of epoch n (collective/).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "weight_broadcast/handshake.h"

namespace prl::weight_broadcast_internal {

inline constexpr absl::string_view kHelloKey = "prl/weights/hello";
inline constexpr absl::string_view kEpochKey = "prl/weights/epoch";
inline constexpr absl::string_view kMemberPrefix = "prl/weights/member/";
// The communicator group (key prefix) of epoch `epoch`.
std::string EpochGroupName(int64_t epoch);

// "gloo (cpu)" or "nccl (cuda)": the handshake's data path for a side on `device`.
std::string CollectiveDataPath(Device device);

// A fresh random 64-bit id (instances, members), never 0.
uint64_t RandomId();

struct Hello {
  uint64_t instance = 0;
  absl::Duration keepalive;  // an idle group hears from the publisher at least this often
  WeightHandshake handshake;
};
std::string EncodeHello(const Hello& hello);
absl::StatusOr<Hello> DecodeHello(absl::string_view text, absl::string_view where);

struct Announcement {
  uint64_t instance = 0;  // the publisher instance this subscriber ran the handshake with
  int64_t beat = 0;       // changes at every heartbeat
  int64_t epoch = 0;      // the last epoch it finished with (left, failed, or was left out of)
  int64_t version = -1;   // the newest version it holds
  std::string host;       // its address as the publisher reaches it
};
std::string EncodeAnnouncement(const Announcement& a);
absl::StatusOr<Announcement> DecodeAnnouncement(absl::string_view text);

struct EpochRecord {
  uint64_t instance = 0;
  int64_t epoch = 0;
  std::vector<std::string> members;  // member ids; members[i] is rank i + 1
};
std::string EncodeEpoch(const EpochRecord& e);
absl::StatusOr<EpochRecord> DecodeEpoch(absl::string_view text);
// The rank of member `id` in `e`, or 0 if it is not a member.
int RankOf(const EpochRecord& e, absl::string_view id);

// The header broadcast before every payload, and alone to keep an idle group alive or to end
// it. 64 bytes, little-endian (every supported host).
enum class HeaderKind : uint32_t { kData = 1, kIdle = 2, kLeave = 3 };
struct WireHeader {
  HeaderKind kind = HeaderKind::kIdle;
  int64_t epoch = 0;
  int64_t version = -1;   // kData
  uint64_t bytes = 0;     // kData: of the payload that follows
  uint64_t checksum = 0;  // kData: PayloadChecksum of the payload
};
inline constexpr size_t kWireHeaderBytes = 64;
std::array<uint8_t, kWireHeaderBytes> EncodeHeader(const WireHeader& h);
// DataLoss naming what is wrong: not a header, or one of another epoch than `epoch`.
absl::StatusOr<WireHeader> DecodeHeader(const std::array<uint8_t, kWireHeaderBytes>& bytes,
                                        int64_t epoch);

// XXH3-64 of `bytes` at `data` on `device` (a CUDA payload is hashed through a small host
// staging buffer, chunk by chunk).
absl::StatusOr<uint64_t> PayloadChecksum(const void* data, Device device, size_t bytes);

// The publisher's view of its members, from their announcements.
//   live:      its beat changed within member_timeout (an expired member's key is deleted;
//              announcing again makes it a new member);
//   available: live, talking to this instance, and finished with every epoch it was put in
//              (its announced epoch >= the last epoch assigned to it).
// The next epoch is formed from the available members, once every member of the epoch that
// ended last is available again, gone, or had `grace` to come back.
//
// Thread-safety: one thread (the publisher's broadcaster).
class MemberTable {
 public:
  MemberTable(uint64_t instance, absl::Duration member_timeout)
      : instance_(instance), member_timeout_(member_timeout) {}

  // Reads the member keys (`keys`: every key under kMemberPrefix, with its value) at `now`.
  // Returns the ids that expired now (their keys should go).
  std::vector<std::string> Refresh(const std::vector<std::pair<std::string, std::string>>& keys,
                                   absl::Time now);
  std::vector<std::string> Available() const;  // in id order
  // Some available member is not in `epoch_members` (a newcomer, or one that left).
  bool HasNewcomer(const std::vector<std::string>& epoch_members) const;
  // Some of `members` stopped beating (expired), or deleted its key (left for good).
  bool AnyExpired(const std::vector<std::string>& members) const;
  bool AnyLeft(const std::vector<std::string>& members) const;
  // `members` are in epoch `epoch` from now on.
  void Assign(const std::vector<std::string>& members, int64_t epoch);
  // The epoch of `members` ended at `now`.
  void Ended(const std::vector<std::string>& members, absl::Time now);
  bool ReadyToForm(absl::Time now, absl::Duration grace) const;
  // The announced address of member `id` ("" if unknown).
  std::string HostOf(const std::string& id) const;
  // The newest version any live member holds; -1 if none.
  int64_t NewestReportedVersion() const;

 private:
  struct Member {
    Announcement said;
    absl::Time changed;    // when its beat last changed
    int64_t assigned = 0;  // the last epoch it was put in
    bool expired = false;
  };
  bool IsAvailable(const Member& m) const;

  const uint64_t instance_;
  const absl::Duration member_timeout_;
  std::map<std::string, Member> members_;
  std::vector<std::string> ended_members_;
  absl::Time ended_at_ = absl::InfinitePast();
};

}  // namespace prl::weight_broadcast_internal
