// GlooStore: a KvStore seen through gloo's rendezvous interface (gloo::rendezvous::Store), so
// that gloo::rendezvous::Context::connectFullMesh exchanges its TCP addresses through prl's
// store, under a key prefix (the group name).
//
// Gloo expects exceptions: every failure throws gloo::IoException. The first failure's
// absl::Status is kept (error()) so that the caller returns it with its code and message
// (DeadlineExceeded naming the key) instead of the exception's text.
//
// Thread-safety: as the underlying store; error() and keys_set() are for after the calls.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/kv_store.h"

namespace prl::collective {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // get() and wait() without a time-out wait up to `timeout`.
  GlooStore(std::shared_ptr<KvStore> store, std::string prefix, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key (gloo's connectFullMesh gets some keys without waiting first).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first error, OK if none.
  absl::Status error() const;
  // The prefixed keys this process set, for deleting them once every rank has read them.
  std::vector<std::string> keys_set() const;

 private:
  // Records the first error and throws it as a gloo::IoException.
  [[noreturn]] void Throw(const absl::Status& status);

  std::shared_ptr<KvStore> store_;
  std::string prefix_;
  absl::Duration timeout_;
  mutable std::mutex mu_;
  absl::Status error_;
  std::vector<std::string> keys_set_;
};

}  // namespace prl::collective
