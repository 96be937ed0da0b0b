// KvStore: the small key-value store the ranks of a learner group rendezvous through (Gloo's
// TCP addresses, NCCL's unique id), and its local implementations.
//
//   MemoryStore  the map itself, in one process; rank 0 serves it to the others over gRPC
//                (collective/store_service.h).
//   FileStore    a directory shared by the ranks of one machine: one file per key, written
//                atomically (temporary file + rename), polled by Get.
//
// Get waits until some rank has set the key, and fails with DeadlineExceeded naming the key
// and the time waited. Values are opaque bytes. Keys are non-empty; a communicator prefixes
// its keys with its group name, so communicators created one after another do not collide.
//
// Thread-safety: every implementation may be called from several threads at once.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collective/rendezvous.h"

namespace prl::collective {

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Stores (or replaces) `value` under `key`.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value of `key`, waiting up to `timeout` for some rank to set it.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;
  // Removes `key`; an absent key is not an error.
  virtual absl::Status Delete(absl::string_view key) = 0;
};

class MemoryStore final : public KvStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::Status Delete(absl::string_view key) override;

  // Every key that starts with `prefix`, with its value, in key order: for the process that
  // owns the store (a service that lets clients announce themselves under a prefix).
  std::vector<std::pair<std::string, std::string>> List(absl::string_view prefix) const;

 private:
  mutable std::mutex mu_;
  std::condition_variable set_;  // notified on every Set
  std::map<std::string, std::string, std::less<>> values_;
};

class FileStore final : public KvStore {
 public:
  // Creates `dir` if needed. The directory belongs to one run: keys are only deleted by the
  // communicators that set them, so a crashed run can leave stale keys behind.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& dir);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::Status Delete(absl::string_view key) override;

  // The file holding `key`: the key with every byte outside [A-Za-z0-9._-] written as %XX.
  std::string PathOf(absl::string_view key) const;

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// The store a rank of `config` rendezvous through: a FileStore when config.file_store_dir is
// set; otherwise rank 0 serves a MemoryStore over gRPC on 0.0.0.0:master_port and uses it
// directly, and the other ranks are gRPC clients of master_addr:master_port that keep trying
// to reach it for config.timeout (rank 0 may start last). Rank 0's server is shared by every
// communicator of the process that uses the same port, and stops with the last of them.
absl::StatusOr<std::shared_ptr<KvStore>> OpenRendezvousStore(const RendezvousConfig& config);

// "DEADLINE_EXCEEDED: kv store get 'key': no value after 5 s (<where>)", the one time-out
// message of every implementation.
absl::Status GetTimedOut(absl::string_view key, absl::Duration waited, absl::string_view where);

// "30 s", "2.5 s": durations in error messages.
std::string SecondsString(absl::Duration d);

}  // namespace prl::collective
