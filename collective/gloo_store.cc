#include "collective/gloo_store.h"

#include <gloo/common/error.h>

#include "absl/strings/str_cat.h"

namespace prl::collective {

GlooStore::GlooStore(std::shared_ptr<KvStore> store, std::string prefix, absl::Duration timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStore::Throw(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = status;
  }
  throw gloo::IoException(status.ToString());
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string full = prefix_ + key;
  const absl::Status s = store_->Set(full, absl::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
  std::lock_guard<std::mutex> lock(mu_);
  keys_set_.push_back(full);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(prefix_ + key, timeout_);
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // gloo::kNoTimeout (zero) means "the default".
  const absl::Duration limit = timeout.count() <= 0 ? timeout_ : absl::FromChrono(timeout);
  const absl::Time deadline = absl::Now() + limit;
  for (const std::string& key : keys) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> value = store_->Get(prefix_ + key, left);
    if (!value.ok()) Throw(value.status());
  }
}

absl::Status GlooStore::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::vector<std::string> GlooStore::keys_set() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_set_;
}

}  // namespace prl::collective
