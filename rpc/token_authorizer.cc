#include "rpc/token_authorizer.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace prl::rpc::internal {

namespace {

constexpr absl::string_view kBearer = "Bearer ";
constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";

// The roles the longest matching prefix of `path` admits (none when nothing matches).
std::set<Role> Admitted(const AccessPolicy& policy, absl::string_view path) {
  const std::set<Role>* best = nullptr;
  size_t best_length = 0;
  for (const auto& [prefix, roles] : policy) {
    if (absl::StartsWith(path, prefix) && prefix.size() >= best_length) {
      best = &roles;
      best_length = prefix.size();
    }
  }
  return best == nullptr ? std::set<Role>() : *best;
}

}  // namespace

absl::StatusOr<std::string> TokenFile::Read() {
  if (path_.empty()) return std::string();
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1) && mtime_ns_ >= 0) return token_;
  checked_ = now;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read token file '", path_, "'"));
  }
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_) return token_;
  std::ifstream in(path_);
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (!in || token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("token file '", path_, "' is empty or unreadable"));
  }
  token_ = std::move(token);
  mtime_ns_ = mtime;
  return token_;
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

TokenAuthorizer::TokenAuthorizer(const SecuritySettings& s, AccessPolicy policy)
    : files_{TokenFile(s.client_token_file), TokenFile(s.actor_token_file),
             TokenFile(s.learner_token_file), TokenFile(s.service_token_file)},
      policy_(std::move(policy)),
      tenants_(TenantTokens::Of(s.tenant_token_files)) {}

TenantTokens::TenantTokens(const std::map<std::string, std::string>& files) {
  for (const auto& [tenant, file] : files) {
    tenants_.emplace_back(tenant, std::make_unique<TokenFile>(file));
  }
}

std::optional<std::string> TenantTokens::TenantOf(absl::string_view token) {
  std::optional<std::string> found;
  for (const auto& [name, file] : tenants_) {  // every file, whatever matched: constant time
    absl::StatusOr<std::string> known = file->Read();
    if (known.ok() && !known->empty() && TokensEqual(token, *known)) found = name;
  }
  return found;
}

namespace {

using TenantTable =
    std::map<std::map<std::string, std::string>, std::unique_ptr<TenantTokens>>;

std::mutex& TenantTableMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

TenantTable& Tenants() {
  static TenantTable* table = new TenantTable();
  return *table;
}

}  // namespace

TenantTokens& TenantTokens::Of(const std::map<std::string, std::string>& files) {
  std::lock_guard<std::mutex> lock(TenantTableMutex());
  std::unique_ptr<TenantTokens>& tokens = Tenants()[files];
  if (tokens == nullptr) tokens = std::make_unique<TenantTokens>(files);
  return *tokens;
}

std::optional<std::string> TenantTokens::AnyTenantOf(absl::string_view token) {
  std::lock_guard<std::mutex> lock(TenantTableMutex());
  std::optional<std::string> found;
  for (auto& [files, tokens] : Tenants()) {
    if (std::optional<std::string> name = tokens->TenantOf(token)) found = std::move(name);
  }
  return found;
}

std::optional<Role> TokenAuthorizer::RoleOf(absl::string_view token, std::string* tenant) {
  std::optional<Role> found;
  for (const NamedValue<Role>& r : kRoleNames) {  // every file, whatever matched: constant time
    absl::StatusOr<std::string> known = files_[static_cast<int>(r.value)].Read();
    if (known.ok() && !known->empty() && TokensEqual(token, *known)) found = r.value;
  }
  if (std::optional<std::string> name = tenants_.TenantOf(token)) {
    found = Role::kClient;
    if (tenant != nullptr) *tenant = *name;
  }
  return found;
}

grpc::Status TokenAuthorizer::Process(const InputMetadata& metadata, grpc::AuthContext* /*context*/,
                                      OutputMetadata* consumed, OutputMetadata*) {
  absl::string_view path, authorization;
  for (const auto& [key, value] : metadata) {
    if (key == ":path") path = absl::string_view(value.data(), value.size());
    if (key == "authorization") authorization = absl::string_view(value.data(), value.size());
  }
  if (absl::StartsWith(path, kHealthPrefix)) return grpc::Status::OK;
  if (authorization.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(path, ": no bearer token (authorization: Bearer TOKEN)"));
  }
  if (!absl::StartsWith(authorization, kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(path, ": the authorization header is not a bearer token"));
  }
  std::string tenant;
  const std::optional<Role> role = RoleOf(authorization.substr(kBearer.size()), &tenant);
  if (!role.has_value()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(path, ": unknown bearer token"));
  }
  // A role's token is consumed; a tenant's stays for rpc::TenantOf (the class comment).
  if (tenant.empty()) consumed->insert({"authorization", std::string(authorization)});
  const std::string name(EnumName(kRoleNames, *role));
  if (Admitted(policy_, path).count(*role) == 0) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(path, ": the ", name, " role may not call this method"));
  }
  return grpc::Status::OK;
}

}  // namespace prl::rpc::internal
