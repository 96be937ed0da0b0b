#include "rpc/security.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/client_interceptor.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/net_address.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"
#include "rpc/token_authorizer.h"

namespace prl::rpc {

namespace {

struct ProcessSecurity {
  SecuritySettings settings;
  std::optional<Role> self;
  std::shared_ptr<internal::TokenFile> token;  // the token this process sends (null: none)
};

// The process's settings: an immutable snapshot, replaced whole by ConfigureSecurity. Several
// roles may share a process (tests, `prl run`'s in-process roles), each configuring it while the
// others' threads make channels: a reader keeps the snapshot it took for as long as it reads it.
std::mutex& CurrentMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::shared_ptr<const ProcessSecurity>& CurrentSlot() {
  static auto* slot =
      new std::shared_ptr<const ProcessSecurity>(std::make_shared<const ProcessSecurity>());
  return *slot;
}
std::shared_ptr<const ProcessSecurity> Current() {
  std::lock_guard<std::mutex> lock(CurrentMutex());
  return CurrentSlot();
}

absl::Status Readable(const std::string& path, absl::string_view key) {
  if (path.empty()) return absl::OkStatus();
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat(key, ": cannot read '", path, "'"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const SecuritySettings& s) {
  PRL_RETURN_IF_ERROR(Readable(s.tls_cert_file, "security.tls_cert_file"));
  PRL_RETURN_IF_ERROR(Readable(s.tls_key_file, "security.tls_key_file"));
  PRL_RETURN_IF_ERROR(Readable(s.tls_ca_file, "security.tls_ca_file"));
  if (s.tls_cert_file.empty() != s.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "security.tls_cert_file and security.tls_key_file: give both (a certificate and its key) "
        "or neither");
  }
  if (s.require_client_cert && (!s.tls() || s.tls_ca_file.empty())) {
    return absl::InvalidArgumentError(
        "security.require_client_cert needs security.tls_cert_file, tls_key_file and tls_ca_file "
        "(the CA that verifies client certificates)");
  }
  std::set<std::string> seen;
  std::vector<const std::string*> files = {&s.client_token_file, &s.actor_token_file,
                                           &s.learner_token_file, &s.service_token_file};
  for (const auto& [tenant, file] : s.tenant_token_files) {
    if (tenant.empty() || file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "security.tenant_token_files: expected a tenant name and a token file, found '",
          tenant.substr(0, 64), "': '", file, "'"));
    }
    files.push_back(&file);
  }
  for (const std::string* file : files) {
    if (file->empty()) continue;
    internal::TokenFile token(*file);
    absl::StatusOr<std::string> text = token.Read();
    if (!text.ok()) return text.status();
    if (!seen.insert(*text).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "security: token file '", *file, "' holds the same token as another role's or tenant's"));
    }
  }
  return absl::OkStatus();
}

// Adds this process's bearer token to every call of a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::shared_ptr<internal::TokenFile> token)
      : token_(std::move(token)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      absl::StatusOr<std::string> token = token_->Read();
      // An unreadable token file sends no token: the server answers UNAUTHENTICATED.
      if (token.ok()) {
        methods->GetSendInitialMetadata()->insert({"authorization", "Bearer " + *token});
      }
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<internal::TokenFile> token_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<internal::TokenFile> token)
      : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(token_);
  }

 private:
  std::shared_ptr<internal::TokenFile> token_;
};

std::shared_ptr<grpc::ServerCredentials> TlsServer(const SecuritySettings& s) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      s.tls_key_file, s.tls_cert_file, s.tls_ca_file, s.cert_refresh_s);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (s.require_client_cert) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TlsChannel(const SecuritySettings& s) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      s.tls_key_file, s.tls_cert_file, s.tls_ca_file, s.cert_refresh_s);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (s.tls()) options.watch_identity_key_cert_pairs();  // mutual TLS: present ours
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace

const AccessPolicy& DefaultAccessPolicy() {
  static const AccessPolicy* policy = new AccessPolicy{
      {"/prl.v1.PromptService/", {Role::kClient}},
      {"/prl.v1.ActorControl/", {Role::kActor}},
      {"/prl.v1.ActorControl/Release", {Role::kActor}},
      {"/prl.v1.ActorControl/ReportLearnerProgress", {Role::kLearner}},
      {"/prl.v1.ActorControl/CheckGroup", {Role::kLearner}},
      {"/prl.v1.ActorControl/ReopenPrompts", {Role::kLearner}},
      {"/prl.v1.ReplayService/", {Role::kActor}},
      {"/prl.v1.WeightService/", {Role::kActor}},
      {"/prl.v1.StoreService/", {Role::kLearner}},
      {"/prl.v1.RewardService/", {Role::kService}},
      {"/prl.v1.EnvironmentService/", {Role::kService}},
      {"/grpc.reflection.", {Role::kClient, Role::kActor, Role::kLearner, Role::kService}},
  };
  return *policy;
}

absl::Status ConfigureSecurity(const SecuritySettings& settings, std::optional<Role> self) {
  PRL_RETURN_IF_ERROR(Validate(settings));
  auto next = std::make_shared<ProcessSecurity>();
  ProcessSecurity& p = *next;
  p.settings = settings;
  p.self = self;
  for (const auto& [address, file] : settings.service_token_files) {
    internal::TokenFile token(file);
    absl::StatusOr<std::string> text = token.Read();
    if (!text.ok()) return text.status();
    if (text->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("security.service_token_files[", address,
                                                     "]: the token file '", file, "' is empty"));
    }
  }
  if (self.has_value()) {
    const std::string* files[] = {&settings.client_token_file, &settings.actor_token_file,
                                  &settings.learner_token_file, &settings.service_token_file};
    const std::string& file = *files[static_cast<int>(*self)];
    if (!file.empty()) p.token = std::make_shared<internal::TokenFile>(file);
  }
  std::lock_guard<std::mutex> lock(CurrentMutex());
  CurrentSlot() = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<std::string> TenantOf(const grpc::ServerContextBase& context) {
  // The authoriser leaves a tenant's token in the call's metadata (and consumes every role's):
  // a call that carries one was admitted with it, and maps to its tenant here. (An AuthContext
  // property would not do: gRPC keeps one context per connection, which calls of several
  // tenants' channels may share.)
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return std::string();
  const absl::string_view authorization(found->second.data(), found->second.size());
  const std::optional<std::string> tenant =
      internal::TenantTokens::AnyTenantOf(absl::StripPrefix(authorization, "Bearer "));
  if (!tenant.has_value()) {
    // Admitted by a token that no longer names a tenant (rotated meanwhile): never the
    // operator's rights.
    return absl::UnauthenticatedError("the tenant's token changed during the call: retry");
  }
  return *tenant;
}

std::string DescribeSecurity() {
  const std::shared_ptr<const ProcessSecurity> current = Current();
  const ProcessSecurity& p = *current;
  const SecuritySettings& s = p.settings;
  std::string out = !s.tls() ? "plaintext" : s.require_client_cert ? "mutual TLS" : "TLS";
  if (!s.tls() && !s.tls_ca_file.empty()) out = "plaintext listeners, TLS to servers";
  if (!s.tls() && !s.insecure) out += " (loopback only)";
  std::vector<std::string> checked;
  const std::string* files[] = {&s.client_token_file, &s.actor_token_file, &s.learner_token_file,
                                &s.service_token_file};
  for (const auto& [name, role] : kRoleNames) {
    if (!files[static_cast<int>(role)]->empty()) checked.emplace_back(name);
  }
  if (!s.tenant_token_files.empty()) {
    checked.push_back(absl::StrCat(s.tenant_token_files.size(), " tenant(s)"));
  }
  absl::StrAppend(&out, checked.empty()
                            ? ", no tokens"
                            : absl::StrCat(", tokens of ", absl::StrJoin(checked, ", ")));
  if (p.token != nullptr) absl::StrAppend(&out, ", calls as ", EnumName(kRoleNames, *p.self));
  if (!s.service_token_files.empty()) {
    absl::StrAppend(&out, ", credentials for ", s.service_token_files.size(), " service(s)");
  }
  return out;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& address, const AccessPolicy& policy) {
  const std::shared_ptr<const ProcessSecurity> current = Current();
  const SecuritySettings& s = current->settings;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (s.tls()) {
    credentials = TlsServer(s);
  } else if (IsLoopbackEndpoint(address)) {
    // Local credentials admit loopback peers only, and (unlike insecure ones) carry a token
    // processor.
    credentials = s.tokens() ? grpc::experimental::LocalServerCredentials(LOCAL_TCP)
                             : grpc::InsecureServerCredentials();
  } else if (!s.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listening on ", address,
        " (not loopback) needs TLS: set security.tls_cert_file and "
        "security.tls_key_file, or security.insecure = true to serve plaintext on purpose"));
  } else if (s.tokens()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listening on ", address,
        " with security.insecure and token files: bearer tokens would "
        "cross the network in plaintext; configure TLS (security.tls_cert_file, tls_key_file)"));
  } else {
    static std::once_flag logged;
    std::call_once(logged, [&] {
      std::fprintf(stderr, "prl: security.insecure: serving %s in plaintext, unauthenticated\n",
                   address.c_str());
    });
    return grpc::InsecureServerCredentials();
  }
  if (s.tokens()) {
    credentials->SetAuthMetadataProcessor(std::make_shared<internal::TokenAuthorizer>(s, policy));
  }
  return credentials;
}

bool TokenMayTravelTo(const std::string& target) {
  const std::shared_ptr<const ProcessSecurity> current = Current();
  const ProcessSecurity& p = *current;
  return p.token == nullptr || !p.settings.tls_ca_file.empty() || IsLoopbackEndpoint(target);
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const grpc::ChannelArguments& args) {
  const std::shared_ptr<const ProcessSecurity> current = Current();
  const ProcessSecurity& p = *current;
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      p.settings.tls_ca_file.empty() ? grpc::InsecureChannelCredentials() : TlsChannel(p.settings);
  if (!TokenMayTravelTo(target)) {
    // The roles refuse such a target at start (roles/role_security.h); any other caller gets a
    // channel without the token, which a server that checks tokens refuses.
    std::fprintf(stderr,
                 "prl: not sending the %s token to %s: it is not loopback and the channel has "
                 "no TLS (set security.tls_ca_file)\n",
                 std::string(EnumName(kRoleNames, *p.self)).c_str(), target.c_str());
    return grpc::CreateCustomChannel(target, credentials, args);
  }
  if (p.token == nullptr) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(p.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(factories));
}

std::shared_ptr<grpc::Channel> NewServiceChannel(const std::string& target,
                                                 const grpc::ChannelArguments& args) {
  const std::shared_ptr<const ProcessSecurity> current = Current();
  const ProcessSecurity& p = *current;
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      p.settings.tls_ca_file.empty() ? grpc::InsecureChannelCredentials() : TlsChannel(p.settings);
  auto file = p.settings.service_token_files.find(target);
  if (file == p.settings.service_token_files.end()) {
    return grpc::CreateCustomChannel(target, credentials, args);  // no token at all
  }
  if (p.settings.tls_ca_file.empty() && !IsLoopbackEndpoint(target)) {
    std::fprintf(stderr,
                 "prl: not sending the credential of %s (security.service_token_files): it is not "
                 "loopback and the channel has no TLS (set security.tls_ca_file)\n",
                 target.c_str());
    return grpc::CreateCustomChannel(target, credentials, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(
      std::make_shared<internal::TokenFile>(file->second)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(factories));
}

}  // namespace prl::rpc
