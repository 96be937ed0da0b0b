// TokenAuthorizer (internal to rpc/): the server side of bearer-token authorisation, a gRPC
// AuthMetadataProcessor that maps the caller's `authorization: Bearer TOKEN` to a role and the
// method (":path") to the roles its AccessPolicy admits. A role's token is consumed (the
// service never sees it); a tenant's token (a client token) is left in the call's metadata,
// where rpc::TenantOf maps it to its tenant (TenantTokens). See security.h for the contract.
//
// Nothing is added to the call's AuthContext: gRPC keeps one per connection, shared by every
// call on it (and by the channels of one process that share a connection), so a property added
// per call would grow without bound and name another call's caller.
//
// Tokens come from files and are re-read when a file changes (checked at most once a second),
// so a rotated token takes effect without a restart. Comparisons take the same time whatever
// the token; no token text is ever logged or put in an error.
//
// Thread-safety: Process may run on many gRPC threads at once.
#pragma once

#include <grpcpp/security/auth_metadata_processor.h>

#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// The tenants' tokens (security.tenant_token_files), each read through a TokenFile.
class TenantTokens {
 public:
  explicit TenantTokens(const std::map<std::string, std::string>& files);
  // The tenant whose token `token` is (every token compared, in constant time), or nullopt.
  std::optional<std::string> TenantOf(absl::string_view token);
  // The process's instance for these files (one per distinct map): every authoriser's, which
  // rpc::TenantOf searches (AnyTenantOf).
  static TenantTokens& Of(const std::map<std::string, std::string>& files);
  // The tenant of `token` among every instance Of made (the servers' authorisers), or nullopt.
  static std::optional<std::string> AnyTenantOf(absl::string_view token);

 private:
  std::vector<std::pair<std::string, std::unique_ptr<TokenFile>>> tenants_;  // name, token
};

class TokenAuthorizer final : public grpc::AuthMetadataProcessor {
 public:
  TokenAuthorizer(const SecuritySettings& settings, AccessPolicy policy);

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // The role of a token, or nullopt (exposed for tests); a tenant's token is the client role,
  // its tenant's name in *tenant.
  std::optional<Role> RoleOf(absl::string_view token, std::string* tenant = nullptr);

 private:
  std::array<TokenFile, kNumRoles> files_;  // by Role
  TenantTokens& tenants_;  // TenantTokens::Of the settings' files
  AccessPolicy policy_;
};

}  // namespace prl::rpc::internal
