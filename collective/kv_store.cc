#include "collective/kv_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collective/store_service.h"
#include "core/net_address.h"
#include "core/status_macros.h"

namespace prl::collective {

namespace {

// Waits longer than this are treated as "forever" (absl::InfiniteDuration would overflow
// the chrono deadline).
constexpr absl::Duration kLongestWait = absl::Hours(24 * 365);

std::chrono::steady_clock::time_point DeadlineAfter(absl::Duration timeout) {
  timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             absl::ToChronoNanoseconds(timeout));
}

absl::Status CheckKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("kv store: the key must not be empty");
  return absl::OkStatus();
}

}  // namespace

std::string SecondsString(absl::Duration d) {
  // Milliseconds at most: a deadline computed from a clock reads 0.999998 s otherwise.
  return absl::StrCat(std::round(absl::ToDoubleSeconds(d) * 1000) / 1000, " s");
}

absl::Status GetTimedOut(absl::string_view key, absl::Duration waited, absl::string_view where) {
  return absl::DeadlineExceededError(absl::StrCat("kv store get '", key, "': no value after ",
                                                  SecondsString(waited), " (", where,
                                                  "; did every rank start?)"));
}

// ---- MemoryStore ---------------------------------------------------------------------------

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  PRL_RETURN_IF_ERROR(CheckKey(key));
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_.insert_or_assign(std::string(key), std::string(value));
  }
  set_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  PRL_RETURN_IF_ERROR(CheckKey(key));
  std::unique_lock<std::mutex> lock(mu_);
  auto it = values_.end();
  const bool found = set_.wait_until(lock, DeadlineAfter(timeout), [&] {
    it = values_.find(key);
    return it != values_.end();
  });
  if (!found) return GetTimedOut(key, timeout, "in-memory store");
  return it->second;
}

absl::Status MemoryStore::Delete(absl::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it != values_.end()) values_.erase(it);
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> MemoryStore::List(absl::string_view prefix) const {
  std::vector<std::pair<std::string, std::string>> found;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && absl::StartsWith(it->first, prefix); ++it) {
    found.emplace_back(it->first, it->second);
  }
  return found;
}

// ---- FileStore -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("file store: the directory must be set");
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    return absl::FailedPreconditionError(absl::StrCat("file store: cannot create directory '", dir,
                                                      "': ", error ? error.message() : "exists"));
  }
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::PathOf(absl::string_view key) const {
  std::string name;
  for (const char c : key) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') {
      name.push_back(c);
    } else {
      absl::StrAppendFormat(&name, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  return absl::StrCat(dir_, "/", name);
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  PRL_RETURN_IF_ERROR(CheckKey(key));
  // Readers see either no file or the whole value: write aside, then rename into place.
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  const std::string temp = absl::StrCat(dir_, "/.tmp.", getpid(), ".", counter++);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      std::remove(temp.c_str());
      return absl::UnavailableError(
          absl::StrCat("file store: cannot write '", temp, "' for key '", key, "'"));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    return absl::UnavailableError(absl::StrCat("file store: cannot rename '", temp, "' to '", path,
                                               "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Duration timeout) {
  PRL_RETURN_IF_ERROR(CheckKey(key));
  const std::string path = PathOf(key);
  const auto deadline = DeadlineAfter(timeout);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream value;
      value << in.rdbuf();
      return value.str();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return GetTimedOut(key, timeout, absl::StrCat("file store ", dir_));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

absl::Status FileStore::Delete(absl::string_view key) {
  std::error_code error;
  std::filesystem::remove(PathOf(key), error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("file store: cannot delete key '", key, "': ", error.message()));
  }
  return absl::OkStatus();
}

// ---- The rendezvous store ------------------------------------------------------------------

namespace {

// Rank 0's store: the map, used directly, and the server that lends it to the other ranks.
class HostedStore final : public KvStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return store_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    return store_.Get(key, timeout);
  }
  absl::Status Delete(absl::string_view key) override { return store_.Delete(key); }

  MemoryStore store_;
  std::unique_ptr<StoreServer> server_;  // declared last: stops before store_ goes
};

}  // namespace

absl::StatusOr<std::shared_ptr<KvStore>> OpenRendezvousStore(const RendezvousConfig& config) {
  PRL_RETURN_IF_ERROR(ValidateRendezvous(config));
  if (!config.file_store_dir.empty()) {
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::Open(config.file_store_dir));
    return std::shared_ptr<KvStore>(std::move(store));
  }
  if (config.rank != 0) {
    return std::make_shared<GrpcStore>(absl::StrCat(config.master_addr, ":", config.master_port),
                                       config.timeout);
  }
  // One server per port and process: communicators created one after another share it.
  static std::mutex mu;
  static std::map<int, std::weak_ptr<KvStore>> hosted;
  std::lock_guard<std::mutex> lock(mu);
  if (std::shared_ptr<KvStore> store = hosted[config.master_port].lock()) return store;
  auto store = std::make_shared<HostedStore>();
  const std::string host = IsLoopbackHost(config.master_addr) ? "127.0.0.1" : "0.0.0.0";
  absl::StatusOr<std::unique_ptr<StoreServer>> server =
      StoreServer::Start(&store->store_, absl::StrCat(host, ":", config.master_port));
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("rank 0 cannot serve the rendezvous store (MASTER_PORT=",
                                     config.master_port, "): ", server.status().message()));
  }
  store->server_ = std::move(server).value();
  hosted[config.master_port] = store;
  return std::shared_ptr<KvStore>(std::move(store));
}

}  // namespace prl::collective
