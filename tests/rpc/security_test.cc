// Trust (rpc/security.h) with real certificates made by openssl and every real prl server: a
// plaintext client cannot talk to a TLS server, mutual TLS refuses a client without a
// certificate, every method answers UNAUTHENTICATED without a token and PERMISSION_DENIED to a
// role it does not admit, a rotated certificate is served without a restart, and a
// non-loopback listener without TLS refuses to start.
#include "rpc/security.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "collective/kv_store.h"
#include "collective/store_service.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "env/builtin_environments.h"
#include "env/environment_server.h"
#include "prl/v1/environment.grpc.pb.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/ingest_server.h"
#include "replay/replay_buffer.h"
#include "reward/reward_service.h"
#include "rpc/grpc_util.h"
#include "weight_broadcast/grpc_transport.h"

namespace prl::rpc {
namespace {

namespace fs = std::filesystem;

// A CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and a second
// CA with its own server certificate (for rotation), in a scratch directory.
class Certificates {
 public:
  Certificates() {
    dir_ = fs::temp_directory_path() / absl::StrCat("prl_security_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Ca("ca");
    Ca("ca2");
    Leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost");
    Leaf("server2", "ca2", "subjectAltName=IP:127.0.0.1,DNS:localhost");
    Leaf("client", "ca", "extendedKeyUsage=clientAuth");
  }
  ~Certificates() { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Token(const std::string& role, const std::string& value) const {
    std::ofstream(path(role + ".token")) << value << "\n";
    return path(role + ".token");
  }

 private:
  void Run(const std::string& command) const {
    const std::string full = absl::StrCat("cd ", dir_.string(), " && ", command, " 2>/dev/null");
    ASSERT_EQ(std::system(full.c_str()), 0) << full;
  }
  void Ca(const std::string& name) const {
    Run(
        absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                     "-keyout ",
                     name, ".key -out ", name, ".crt -days 2 -subj /CN=prl-test-", name));
  }
  void Leaf(const std::string& name, const std::string& ca, const std::string& ext) const {
    std::ofstream(path(name + ".ext")) << ext << "\n";
    Run(
        absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                     "-keyout ",
                     name, ".key -out ", name, ".csr -subj /CN=prl-", name));
    Run(absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".crt -CAkey ", ca,
                     ".key -CAcreateserial -out ", name, ".crt -days 2 -extfile ", name, ".ext"));
  }
  fs::path dir_;
};

// A unary call of `method` with an empty message: the status says whether the caller got past
// the transport and authorisation (the handler's own answer to an empty message is beside the
// point).
grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty{std::string()};
  grpc::ByteBuffer request(&empty, 1), response;
  return grpc::internal::BlockingUnaryCall(
      channel.get(),
      grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &ctx,
      request, &response);
}

bool Admitted(const grpc::Status& s) {
  return s.error_code() != grpc::StatusCode::UNAUTHENTICATED &&
         s.error_code() != grpc::StatusCode::PERMISSION_DENIED &&
         s.error_code() != grpc::StatusCode::UNAVAILABLE;
}

class SecurityTest : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(ConfigureSecurity({}, std::nullopt).ok()); }

  SecuritySettings Tokens() const {
    SecuritySettings s;
    s.client_token_file = certs_.Token("client", "client-secret-1");
    s.actor_token_file = certs_.Token("actor", "actor-secret-2");
    s.learner_token_file = certs_.Token("learner", "learner-secret-3");
    s.service_token_file = certs_.Token("service", "service-secret-4");
    return s;
  }
  SecuritySettings Tls(bool mutual) const {
    SecuritySettings s = Tokens();
    s.tls_cert_file = certs_.path("server.crt");
    s.tls_key_file = certs_.path("server.key");
    s.tls_ca_file = certs_.path("ca.crt");
    s.require_client_cert = mutual;
    s.cert_refresh_s = 1;
    return s;
  }
  // A channel of a client configured with `s` calling as `role` (nullopt: no token).
  std::shared_ptr<grpc::Channel> Channel(SecuritySettings s, std::optional<Role> role, int port) {
    EXPECT_TRUE(ConfigureSecurity(s, role).ok());
    return NewChannel(absl::StrCat("127.0.0.1:", port), ChannelArgs(int64_t{1} << 20));
  }

  Certificates certs_;
};

IngestOptions IngestAt(const std::string& address) {
  IngestOptions options;
  options.address = address;
  return options;
}

// Every server prl runs, each started under the process's security as it is when called.
struct Servers {
  std::unique_ptr<coordinator::Coordinator> coordinator;
  std::unique_ptr<coordinator::CoordinatorServer> coordinator_server;
  std::unique_ptr<ReplayBuffer> replay;
  std::unique_ptr<ReplayIngestServer> ingest;
  std::unique_ptr<GrpcWeightPublisher> weights;
  collective::MemoryStore memory;
  std::unique_ptr<collective::StoreServer> store;
  std::unique_ptr<reward::RewardServer> reward;
  std::unique_ptr<env::EnvironmentServer> environments;
  ModelConfig model;
  std::string dir, segment;

  Servers() {
    dir = (fs::temp_directory_path() / absl::StrCat("prl_security_servers_", getpid())).string();
    segment = absl::StrCat("prl-security-test-", getpid());
    fs::create_directories(dir);
    coordinator::CoordinatorConfig cc;
    cc.log_path = dir + "/prompts.log";
    cc.vocab_size = 16;
    cc.max_position_embeddings = 32;
    coordinator = *coordinator::Coordinator::Open(cc);
    coordinator_server = *coordinator::CoordinatorServer::Start(coordinator.get(), "127.0.0.1:0");
    ReplayConfig rc;
    rc.capacity_bytes = 1 << 20;
    ReplayBuffer::Remove(segment, true).IgnoreError();
    replay = *ReplayBuffer::Create(segment, rc);
    ingest = *ReplayIngestServer::Start(replay.get(), IngestAt("127.0.0.1:0"));
    ModelConfig& m = model;
    m.arch = Architecture::kQwen2;
    m.hidden_size = 8;
    m.intermediate_size = 16;
    m.num_hidden_layers = 1;
    m.num_attention_heads = 2;
    m.num_key_value_heads = 1;
    m.head_dim = 4;
    m.vocab_size = 16;
    m.max_position_embeddings = 32;
    weights = *GrpcWeightPublisher::Start(m, {.address = "127.0.0.1:0"});
    store = *collective::StoreServer::Start(&memory, "127.0.0.1:0");
    reward = *reward::RewardServer::Start(
        [](absl::Span<const reward::RewardInput> in) {
          return absl::StatusOr<std::vector<reward::RewardResult>>(
              std::vector<reward::RewardResult>(in.size()));
        },
        {.address = "127.0.0.1:0"});
    environments =
        *env::EnvironmentServer::Start(env::AllBuiltinEnvironments(), {.address = "127.0.0.1:0"});
  }
  ~Servers() {
    environments.reset();
    reward.reset();
    store.reset();
    weights.reset();
    ingest.reset();
    replay.reset();
    ReplayBuffer::Remove(segment, true).IgnoreError();
    coordinator_server.reset();
    coordinator.reset();
    fs::remove_all(dir);
  }
};

TEST_F(SecurityTest, EveryMethodOfEveryServerAdmitsOnlyItsRoles) {
  ASSERT_TRUE(ConfigureSecurity(Tokens(), std::nullopt).ok());
  Servers servers;
  struct Method {
    int port;
    std::string path;
    Role admitted;
  };
  const std::vector<Method> methods = {
      {servers.coordinator_server->port(), "/prl.v1.PromptService/SubmitPromptSet", Role::kClient},
      {servers.coordinator_server->port(), "/prl.v1.PromptService/ListPromptSets", Role::kClient},
      {servers.coordinator_server->port(), "/prl.v1.ActorControl/LeasePrompts", Role::kActor},
      {servers.coordinator_server->port(), "/prl.v1.ActorControl/Complete", Role::kActor},
      {servers.coordinator_server->port(), "/prl.v1.ActorControl/Release", Role::kActor},
      {servers.coordinator_server->port(), "/prl.v1.ActorControl/ReportLearnerProgress",
       Role::kLearner},
      {servers.coordinator_server->port(), "/prl.v1.ActorControl/CheckGroup", Role::kLearner},
      {servers.ingest->port(), "/prl.v1.ReplayService/Push", Role::kActor},
      {servers.weights->port(), "/prl.v1.WeightService/Subscribe", Role::kActor},
      {servers.store->port(), "/prl.v1.StoreService/Set", Role::kLearner},
      // User-written services (prl reward serve, prl env serve): their own credential only.
      {servers.reward->port(), "/prl.v1.RewardService/Score", Role::kService},
      {servers.environments->port(), "/prl.v1.EnvironmentService/StartEpisode", Role::kService},
  };
  for (const Method& m : methods) {
    const grpc::Status anonymous = Call(Channel(Tokens(), std::nullopt, m.port), m.path);
    EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << m.path << ": " << anonymous.error_message();
    SecuritySettings wrong = Tokens();
    wrong.client_token_file = certs_.Token("forged", "not-a-token");
    EXPECT_EQ(Call(Channel(wrong, Role::kClient, m.port), m.path).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << m.path;
    for (const NamedValue<Role>& r : kRoleNames) {
      const grpc::Status s = Call(Channel(Tokens(), r.value, m.port), m.path);
      if (r.value == m.admitted) {
        EXPECT_TRUE(Admitted(s)) << m.path << " as " << r.name << ": " << s.error_message();
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << m.path << " as " << r.name << ": " << s.error_message();
      }
    }
  }
  // Health checking stays open to everyone (probes carry no token).
  EXPECT_TRUE(Admitted(Call(Channel(Tokens(), std::nullopt, servers.store->port()),
                            "/grpc.health.v1.Health/Check")));
}

// No call takes a server down: a handler's exception (injected at rpc::Guarded's ThrowPoint,
// where every prl service method's body runs) is INTERNAL naming the call and the method, and
// the same server answers the next call.
TEST_F(SecurityTest, EveryMethodOfEveryServerAnswersAHandlersExceptionWithInternalAndGoesOn) {
  ASSERT_TRUE(ConfigureSecurity({}, std::nullopt).ok());
  Servers servers;
  const std::vector<std::pair<int, std::string>> methods = {
      {servers.coordinator_server->port(), "prl.v1.PromptService/SubmitPromptSet"},
      {servers.coordinator_server->port(), "prl.v1.PromptService/ListPromptSets"},
      {servers.coordinator_server->port(), "prl.v1.PromptService/WatchPromptSet"},
      {servers.coordinator_server->port(), "prl.v1.ActorControl/LeasePrompts"},
      {servers.coordinator_server->port(), "prl.v1.ActorControl/Complete"},
      {servers.coordinator_server->port(), "prl.v1.ActorControl/Register"},
      {servers.ingest->port(), "prl.v1.ReplayService/Push"},
      {servers.weights->port(), "prl.v1.WeightService/Subscribe"},
      {servers.store->port(), "prl.v1.StoreService/Set"},
      {servers.reward->port(), "prl.v1.RewardService/Score"},
      {servers.environments->port(), "prl.v1.EnvironmentService/StartEpisode"},
      {servers.environments->port(), "prl.v1.EnvironmentService/Step"},
  };
  for (const auto& [port, method] : methods) {
    const auto channel = NewChannel(absl::StrCat("127.0.0.1:", port), ChannelArgs(1 << 20));
    ASSERT_EQ(setenv("PRL_THROW_POINT", method.c_str(), 1), 0);
    const grpc::Status failed = Call(channel, "/" + method);
    unsetenv("PRL_THROW_POINT");
    EXPECT_EQ(failed.error_code(), grpc::StatusCode::INTERNAL)
        << method << ": " << failed.error_message();
    EXPECT_NE(failed.error_message().find("internal error (call "), std::string::npos)
        << failed.error_message();
    EXPECT_NE(failed.error_message().find(" of " + method), std::string::npos)
        << failed.error_message();
    const grpc::Status next = Call(channel, "/" + method);
    EXPECT_NE(next.error_code(), grpc::StatusCode::INTERNAL)
        << method << ": " << next.error_message();
    EXPECT_NE(next.error_code(), grpc::StatusCode::UNAVAILABLE) << method << " went down";
  }
}

// An EnvironmentService that records the authorization header of every call.
class RecordingEnvironment final : public v1::EnvironmentService::Service {
 public:
  grpc::Status StartEpisode(grpc::ServerContext* context, const v1::StartEpisodeRequest*,
                            v1::StartEpisodeResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = context->client_metadata().find("authorization");
    seen_.push_back(it == context->client_metadata().end()
                        ? std::string()
                        : std::string(it->second.data(), it->second.size()));
    return grpc::Status::OK;
  }
  std::vector<std::string> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> seen_;
};

struct Recorder {
  RecordingEnvironment service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  Recorder() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  void Call() {
    auto stub = v1::EnvironmentService::NewStub(
        NewServiceChannel(address(), ChannelArgs(int64_t{1} << 20)));
    grpc::ClientContext ctx;
    v1::StartEpisodeRequest request;
    v1::StartEpisodeResponse response;
    EXPECT_TRUE(stub->StartEpisode(&ctx, request, &response).ok());
  }
};

// An environment or a remote reward is third-party code: an actor's calls to it carry no role
// token, only the credential configured for its address (and no other address gets that).
// A tenant's token (security.tenant_token_files) is a client token that names its tenant to the
// coordinator: over real gRPC, each tenant submits to its own adapters, lists and reads only its
// own sets, and the operator's client token sees all; an actor's token is still refused.
TEST_F(SecurityTest, ATenantsTokenNamesItsTenantToTheCoordinator) {
  SecuritySettings server_settings = Tokens();
  server_settings.tenant_token_files = {{"team-a", certs_.Token("team-a", "tenant-secret-a")},
                                        {"team-b", certs_.Token("team-b", "tenant-secret-b")}};
  ASSERT_TRUE(ConfigureSecurity(server_settings, std::nullopt).ok());
  coordinator::CoordinatorConfig cc;
  const std::string dir =
      (fs::temp_directory_path() / absl::StrCat("prl_security_tenants_", getpid())).string();
  fs::create_directories(dir);
  cc.log_path = dir + "/prompts.log";
  cc.vocab_size = 16;
  cc.max_position_embeddings = 32;
  cc.validate_reward = [](const prl::v1::RewardSpec&) { return absl::OkStatus(); };
  cc.adapters = true;
  cc.adapter_defaults.set_rank(4);
  cc.adapter_defaults.set_alpha(8);
  cc.tenants["team-a"].adapters = {"a-*"};
  cc.tenants["team-b"].adapters = {"b-*"};
  auto coordinator = *coordinator::Coordinator::Open(cc);
  auto server = *coordinator::CoordinatorServer::Start(coordinator.get(), "127.0.0.1:0");
  const auto stub_as = [&](const std::string& token_file, Role role) {
    SecuritySettings client;
    (role == Role::kClient ? client.client_token_file : client.actor_token_file) = token_file;
    return prl::v1::PromptService::NewStub(Channel(client, role, server->port()));
  };
  const auto submit = [](prl::v1::PromptService::Stub& stub, const std::string& adapter,
                         std::string* id) {
    prl::v1::SubmitPromptSetRequest r;
    r.add_prompts()->mutable_tokens()->add_ids(1);
    r.set_samples_per_prompt(1);
    r.mutable_sampling()->set_top_p(1);
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_reward()->set_name("exact_match");
    r.mutable_adapter()->set_name(adapter);
    grpc::ClientContext ctx;
    prl::v1::SubmitPromptSetResponse response;
    const grpc::Status s = stub.SubmitPromptSet(&ctx, r, &response);
    if (id != nullptr) *id = response.prompt_set_id();
    return s;
  };
  const auto listed = [](prl::v1::PromptService::Stub& stub) {
    grpc::ClientContext ctx;
    prl::v1::ListPromptSetsResponse response;
    EXPECT_TRUE(stub.ListPromptSets(&ctx, {}, &response).ok());
    return response.prompt_sets_size();
  };
  auto a = stub_as(server_settings.tenant_token_files["team-a"], Role::kClient);
  auto b = stub_as(server_settings.tenant_token_files["team-b"], Role::kClient);
  auto op = stub_as(server_settings.client_token_file, Role::kClient);
  std::string a_set;
  ASSERT_TRUE(submit(*a, "a-math", &a_set).ok());
  const grpc::Status crossed = submit(*b, "a-math", nullptr);
  EXPECT_EQ(crossed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << crossed.error_message();
  EXPECT_NE(crossed.error_message().find("coordinator.tenants.team-b.adapters"), std::string::npos)
      << crossed.error_message();
  const grpc::Status b_code = submit(*b, "b-code", nullptr);
  ASSERT_TRUE(b_code.ok()) << b_code.error_message();
  EXPECT_EQ(listed(*a), 1);
  EXPECT_EQ(listed(*b), 1);
  EXPECT_EQ(listed(*op), 2);
  grpc::ClientContext ctx;
  prl::v1::GetPromptSetRequest get;
  get.set_prompt_set_id(a_set);
  prl::v1::PromptSetStatus status;
  EXPECT_EQ(b->GetPromptSet(&ctx, get, &status).error_code(), grpc::StatusCode::NOT_FOUND);
  // A tenant's token is a client's only: the actors' service refuses it.
  SecuritySettings as_actor;
  as_actor.actor_token_file = server_settings.tenant_token_files["team-a"];
  EXPECT_EQ(
      Call(Channel(as_actor, Role::kActor, server->port()), "/prl.v1.ActorControl/LeasePrompts")
          .error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  server.reset();
  coordinator.reset();
  fs::remove_all(dir);
}

TEST_F(SecurityTest, AUserWrittenServiceGetsItsOwnCredentialAndNeverARoleToken) {
  Recorder with_credential, without;
  SecuritySettings actor = Tokens();
  actor.service_token_files[with_credential.address()] = certs_.Token("env", "env-credential-5");
  ASSERT_TRUE(ConfigureSecurity(actor, Role::kActor).ok());
  with_credential.Call();
  without.Call();
  EXPECT_EQ(with_credential.service.seen(), std::vector<std::string>{"Bearer env-credential-5"});
  EXPECT_EQ(without.service.seen(), std::vector<std::string>{""});
  // The role's own channels still carry its token (to prl's own servers).
  grpc::ClientContext ctx;
  v1::StartEpisodeResponse response;
  ASSERT_TRUE(
      v1::EnvironmentService::NewStub(NewChannel(without.address(), ChannelArgs(int64_t{1} << 20)))
          ->StartEpisode(&ctx, v1::StartEpisodeRequest(), &response)
          .ok());
  EXPECT_EQ(without.service.seen().back(), "Bearer actor-secret-2");
}

TEST_F(SecurityTest, TokenMessagesNeverCarryTheToken) {
  ASSERT_TRUE(ConfigureSecurity(Tokens(), std::nullopt).ok());
  Servers servers;
  const grpc::Status s = Call(Channel(Tokens(), Role::kActor, servers.coordinator_server->port()),
                              "/prl.v1.PromptService/ListPromptSets");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message().find("actor-secret-2"), std::string::npos) << s.error_message();
}

TEST_F(SecurityTest, APlaintextClientCannotTalkToATlsServer) {
  ASSERT_TRUE(ConfigureSecurity(Tls(false), std::nullopt).ok());
  collective::MemoryStore memory;
  auto store = *collective::StoreServer::Start(&memory, "127.0.0.1:0");
  const std::string method = "/prl.v1.StoreService/Set";
  EXPECT_EQ(Call(Channel(Tokens(), Role::kLearner, store->port()), method).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  SecuritySettings client = Tokens();
  client.tls_ca_file = certs_.path("ca.crt");
  EXPECT_TRUE(Admitted(Call(Channel(client, Role::kLearner, store->port()), method)));
  // A client that trusts another CA does not accept the server.
  client.tls_ca_file = certs_.path("ca2.crt");
  EXPECT_EQ(Call(Channel(client, Role::kLearner, store->port()), method).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsRefusesAClientWithoutACertificate) {
  ASSERT_TRUE(ConfigureSecurity(Tls(true), std::nullopt).ok());
  collective::MemoryStore memory;
  auto store = *collective::StoreServer::Start(&memory, "127.0.0.1:0");
  const std::string method = "/prl.v1.StoreService/Set";
  SecuritySettings client = Tokens();
  client.tls_ca_file = certs_.path("ca.crt");
  EXPECT_EQ(Call(Channel(client, Role::kLearner, store->port()), method).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  client.tls_cert_file = certs_.path("client.crt");
  client.tls_key_file = certs_.path("client.key");
  EXPECT_TRUE(Admitted(Call(Channel(client, Role::kLearner, store->port()), method)));
}

TEST_F(SecurityTest, ARotatedCertificateIsServedWithoutARestart) {
  SecuritySettings server = Tls(false);
  fs::copy_file(certs_.path("server.crt"), certs_.path("live.crt"));
  fs::copy_file(certs_.path("server.key"), certs_.path("live.key"));
  server.tls_cert_file = certs_.path("live.crt");
  server.tls_key_file = certs_.path("live.key");
  ASSERT_TRUE(ConfigureSecurity(server, std::nullopt).ok());
  collective::MemoryStore memory;
  auto store = *collective::StoreServer::Start(&memory, "127.0.0.1:0");
  const std::string method = "/prl.v1.StoreService/Set";
  SecuritySettings trusts_ca2 = Tokens();
  trusts_ca2.tls_ca_file = certs_.path("ca2.crt");
  EXPECT_FALSE(Admitted(Call(Channel(trusts_ca2, Role::kLearner, store->port()), method)));
  // Kubernetes-style rotation: new files in place, the server keeps running.
  fs::copy_file(certs_.path("server2.key"), certs_.path("live.key"),
                fs::copy_options::overwrite_existing);
  fs::copy_file(certs_.path("server2.crt"), certs_.path("live.crt"),
                fs::copy_options::overwrite_existing);
  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    rotated = Admitted(Call(Channel(trusts_ca2, Role::kLearner, store->port()), method));
  }
  EXPECT_TRUE(rotated) << "the new certificate was never served";
}

TEST_F(SecurityTest, NonLoopbackListenersNeedTlsOrAnExplicitInsecureChoice) {
  ASSERT_TRUE(ConfigureSecurity({}, std::nullopt).ok());
  const absl::Status refused = ServerCredentialsFor("0.0.0.0:0").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("security.insecure"), std::string::npos) << refused;
  SecuritySettings insecure;
  insecure.insecure = true;
  ASSERT_TRUE(ConfigureSecurity(insecure, std::nullopt).ok());
  EXPECT_TRUE(ServerCredentialsFor("0.0.0.0:0").ok());
  // Tokens would cross the network readable: refused even with insecure.
  SecuritySettings plaintext_tokens = Tokens();
  plaintext_tokens.insecure = true;
  ASSERT_TRUE(ConfigureSecurity(plaintext_tokens, std::nullopt).ok());
  EXPECT_EQ(ServerCredentialsFor("0.0.0.0:0").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ServerCredentialsFor("127.0.0.1:0").ok());
  ASSERT_TRUE(ConfigureSecurity(Tls(false), std::nullopt).ok());
  EXPECT_TRUE(ServerCredentialsFor("0.0.0.0:0").ok());
}

TEST_F(SecurityTest, EveryServerRefusedAPlaintextNetworkListenerReturnsTheErrorWithoutCrashing) {
  ASSERT_TRUE(ConfigureSecurity({}, std::nullopt).ok());
  Servers servers;  // on loopback: allowed
  const std::string wide = "0.0.0.0:0";
  const auto expect_refused = [](const absl::Status& status, absl::string_view server) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << server << ": " << status;
    EXPECT_NE(status.message().find("security.insecure"), std::string::npos) << status;
  };
  expect_refused(coordinator::CoordinatorServer::Start(servers.coordinator.get(), wide).status(),
                 "coordinator");
  expect_refused(ReplayIngestServer::Start(servers.replay.get(), IngestAt(wide)).status(),
                 "replay ingest");
  expect_refused(GrpcWeightPublisher::Start(servers.model, {.address = wide}).status(), "weights");
  expect_refused(collective::StoreServer::Start(&servers.memory, wide).status(), "store");
  expect_refused(reward::RewardServer::Start(
                     [](absl::Span<const reward::RewardInput> in) {
                       return absl::StatusOr<std::vector<reward::RewardResult>>(
                           std::vector<reward::RewardResult>(in.size()));
                     },
                     {.address = wide})
                     .status(),
                 "reward");
}

TEST_F(SecurityTest, TheDescriptionSaysWhatIsProtectedAndNeverATokenOrKey) {
  ASSERT_TRUE(ConfigureSecurity({}, std::nullopt).ok());
  EXPECT_EQ(DescribeSecurity(), "plaintext (loopback only), no tokens");
  SecuritySettings s = Tls(true);
  s.learner_token_file.clear();
  s.service_token_file.clear();
  s.service_token_files["127.0.0.1:7000"] = certs_.Token("env", "env-credential-5");
  ASSERT_TRUE(ConfigureSecurity(s, Role::kActor).ok());
  const std::string described = DescribeSecurity();
  EXPECT_EQ(described,
            "mutual TLS, tokens of client, actor, calls as actor, credentials for 1 service(s)");
  for (const std::string& file :
       {s.client_token_file, s.actor_token_file, s.service_token_files.begin()->second}) {
    std::ifstream in(file);
    const std::string secret((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(described.find(std::string(absl::StripAsciiWhitespace(secret))), std::string::npos);
  }
}

TEST_F(SecurityTest, BadSettingsNameTheKey) {
  SecuritySettings s;
  s.tls_cert_file = certs_.path("server.crt");
  EXPECT_NE(ConfigureSecurity(s, std::nullopt).message().find("tls_key_file"), std::string::npos);
  s = Tokens();
  s.actor_token_file = s.client_token_file;
  EXPECT_NE(ConfigureSecurity(s, std::nullopt).message().find("same token"), std::string::npos);
  s = Tokens();
  s.learner_token_file = certs_.path("missing.token");
  EXPECT_NE(ConfigureSecurity(s, std::nullopt).message().find("missing.token"), std::string::npos);
  s = {};
  s.require_client_cert = true;
  EXPECT_NE(ConfigureSecurity(s, std::nullopt).message().find("require_client_cert"),
            std::string::npos);
}

}  // namespace
}  // namespace prl::rpc
