// Trust (docs/security.md): how every prl gRPC server admits callers and every client reaches
// a server, in one place. A process configures it once at start (ConfigureSecurity, from the
// run config's `security` section) before it starts a server or opens a channel; after that
// rpc::StartServer (grpc_util.h) and rpc::NewChannel use it, and no service looks at a token.
//
// Transport (per listener, by its address):
//   - TLS when security.tls_cert_file/tls_key_file are set: the certificate and key (and the CA
//     that verifies client certificates when require_client_cert, i.e. mutual TLS) are read
//     from their files and re-read when the files change, without a restart (Kubernetes
//     rotates mounted secrets);
//   - without TLS, a loopback listener serves plaintext to local callers only;
//   - a non-loopback listener without TLS refuses to start unless security.insecure is true,
//     an explicit choice logged once; then it serves plaintext without authentication, so
//     bearer tokens (which would cross the network readable) are refused with it.
// Clients verify servers with security.tls_ca_file (and present their own certificate for
// mutual TLS).
//
// Authorisation: with token files configured, a caller sends `authorization: Bearer TOKEN` and
// the token names its role (client, actor, learner, or service; compared in constant time, never
// logged).
// Every method states which roles may call it (the AccessPolicy a server starts with; the
// default is DefaultAccessPolicy). A missing or unknown token is UNAUTHENTICATED; a known
// token of a role the method does not admit is PERMISSION_DENIED. A tenant's token
// (security.tenant_token_files) is a client token that also names its tenant (TenantOf). gRPC
// health checking stays open to everyone. Without token files, every caller that reaches the server is admitted.
//
// User-written services (an environment, a remote reward; docs/security.md) are third-party code:
// a role's token never goes to them. NewServiceChannel reaches one with no role token, and with
// the credential the operator configured for its address (security.service_token_files), which
// a service checks as the `service` role (prl env serve, prl reward serve:
// security.service_token_file).
//
// Thread-safety: every function from any thread. A process configures its settings at start;
// where several roles share a process (tests), each configuring them, ConfigureSecurity replaces
// them whole: a channel or server made meanwhile takes the old or the new ones, never a mix.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/enum_names.h"

namespace prl::rpc {

// kService: what callers of a user-written service present (the credential of its address).
enum class Role { kClient, kActor, kLearner, kService };
inline constexpr int kNumRoles = 4;
inline constexpr NamedValue<Role> kRoleNames[] = {{"client", Role::kClient},
                                                  {"actor", Role::kActor},
                                                  {"learner", Role::kLearner},
                                                  {"service", Role::kService}};

struct SecuritySettings {
  std::string tls_cert_file, tls_key_file;  // this process's certificate chain and key (PEM)
  std::string tls_ca_file;                  // the CA bundle that verifies peers (PEM)
  bool require_client_cert = false;         // servers demand a client certificate (mTLS)
  bool insecure = false;                    // non-loopback listeners may serve plaintext
  // One token per role (files of one line; surrounding whitespace is ignored).
  std::string client_token_file, actor_token_file, learner_token_file;
  // The token this process's user-facing services (EnvironmentService, RewardService) accept,
  // as the service role.
  std::string service_token_file;
  // host:port -> the token file presented to the user-written service there (and to no other
  // address): an environment's or a remote reward's own credential, never a role's.
  std::map<std::string, std::string> service_token_files;
  // Tenants (docs/tenants.md): tenant name -> the token file of its client token. A tenant's
  // token is a client token limited to what coordinator.tenants allows it: the server learns
  // the caller's tenant from it (TenantOf).
  std::map<std::string, std::string> tenant_token_files;
  int cert_refresh_s = 10;  // how often certificate files are checked for changes

  bool tls() const { return !tls_cert_file.empty(); }
  bool tokens() const {
    return !client_token_file.empty() || !actor_token_file.empty() || !learner_token_file.empty() ||
           !service_token_file.empty() || !tenant_token_files.empty();
  }
};

// Method path prefixes ("/prl.v1.PromptService/" or a full method) -> the roles admitted; the
// longest matching prefix decides. A method no prefix matches admits no role.
using AccessPolicy = std::map<std::string, std::set<Role>>;
// PromptService: client; ActorControl: actor, ReportLearnerProgress, CheckGroup and
// ReopenPrompts: learner; ReplayService and WeightService: actor; StoreService: learner;
// EnvironmentService and RewardService: service (a user-written service's own credential);
// server reflection: every role.
const AccessPolicy& DefaultAccessPolicy();

// Validates the settings (files readable, token files non-empty and distinct, a key with a
// certificate) and makes them this process's (on an error the settings stay as they were).
// `self`: the role this process calls others as (its token goes out with every call); nullopt
// for a process that only serves.
absl::Status ConfigureSecurity(const SecuritySettings& settings, std::optional<Role> self);

// The credentials of a listener on `address` under this process's settings, admitting callers
// by `policy`; an address the settings do not allow (non-loopback without TLS or insecure) is
// FailedPrecondition naming the keys that would allow it.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& address, const AccessPolicy& policy = DefaultAccessPolicy());

// A channel to `target` under this process's settings: TLS when a CA is configured, this
// process's token on every call where TokenMayTravelTo(target) (elsewhere none, said once on
// stderr per channel); `args` as the caller sets them (rpc::ChannelArgs: message limits).
std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const grpc::ChannelArguments& args);

// A channel to a user-written service at `target` (an EnvironmentService, a RewardService): TLS
// as NewChannel, never this process's role token; the token of
// security.service_token_files[target] on every call where it may travel (TLS to servers, or
// loopback; elsewhere none, said once on stderr).
std::shared_ptr<grpc::Channel> NewServiceChannel(const std::string& target,
                                                 const grpc::ChannelArguments& args);

// Whether this process's token may go to `target`: no token, TLS to servers
// (security.tls_ca_file), or a loopback target (core/net_address.h). NewChannel never sends the
// token elsewhere: a bearer token in plaintext would cross the network readable.
bool TokenMayTravelTo(const std::string& target);

// The tenant whose token the caller presented (security.tenant_token_files), or "" (another
// role's token, or a server without tokens). Unauthenticated (never "") when the call carries
// a tenant's token that no longer names one (its file changed during the call).
absl::StatusOr<std::string> TenantOf(const grpc::ServerContextBase& context);

// This process's settings in words, for start-up lines: TLS or plaintext, mutual or not, which
// roles' tokens it checks, and whether it sends one. Never a token or a key.
std::string DescribeSecurity();

}  // namespace prl::rpc
