// TokenAuthorizer (internal to rpc/): the server side of bearer-token authorisation, a gRPC
// AuthMetadataProcessor that maps the caller's `authorization: Bearer TOKEN` to a role and the
// method (":path") to the roles its AccessPolicy admits. See security.h for the contract.
//
// Tokens come from files and are re-read when a file changes (checked at most once a second),
// so a rotated token takes effect without a restart. Comparisons take the same time whatever
// the token; no token text is ever logged or put in an error.
//
// Thread-safety: Process may run on many gRPC threads at once.
#pragma once

#include <grpcpp/security/auth_metadata_processor.h>

#include <array>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/security.h"

namespace prl::rpc::internal {

// A token file: its content (trimmed), re-read when its modification time changes.
class TokenFile {
 public:
  explicit TokenFile(std::string path) : path_(std::move(path)) {}
  // The current token ("" when the file is unset). Errors name the file (never its content).
  absl::StatusOr<std::string> Read();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::mutex mu_;
  int64_t mtime_ns_ = -1;
  std::string token_;
  absl::Time checked_ = absl::InfinitePast();
};

// Constant-time equality of two byte strings (the time depends only on their lengths).
bool TokensEqual(absl::string_view a, absl::string_view b);

class TokenAuthorizer final : public grpc::AuthMetadataProcessor {
 public:
  TokenAuthorizer(const SecuritySettings& settings, AccessPolicy policy);

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // The role of a token, or nullopt (exposed for tests).
  std::optional<Role> RoleOf(absl::string_view token);

 private:
  std::array<TokenFile, kNumRoles> files_;  // by Role
  AccessPolicy policy_;
};

}  // namespace prl::rpc::internal
