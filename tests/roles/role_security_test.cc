// A role never sends its bearer token in plaintext off the machine (issue 28: a client with a
// token file and no CA sent it to any address): a role whose config would do so is refused at
// start, naming the key and the address, and a channel to such a target goes without it.
#include "roles/role_security.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace prl::roles {
namespace {

namespace fs = std::filesystem;

class RoleSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("prl_role_security_", getpid());
    fs::create_directories(dir_);
    for (const char* role : {"client", "actor", "learner"}) {
      std::ofstream(dir_ / role) << role << "-secret\n";
    }
    config_.security.client_token_file = (dir_ / "client").string();
    config_.security.actor_token_file = (dir_ / "actor").string();
    config_.security.learner_token_file = (dir_ / "learner").string();
  }
  void TearDown() override {
    rpc::ConfigureSecurity({}, std::nullopt).IgnoreError();
    fs::remove_all(dir_);
  }

  absl::Status Configure(rpc::Role self) { return ConfigureRoleSecurity(config_, self, {}); }

  fs::path dir_;
  config::RunConfig config_;
};

TEST_F(RoleSecurityTest, ATokenNeverGoesInPlaintextToAnAddressThatIsNotLoopback) {
  for (const char* address :
       {"10.0.0.5:50051", "coordinator.prl.svc:50051", "127.evil.example:50051"}) {
    config_.coordinator.address = address;
    for (rpc::Role self : {rpc::Role::kActor, rpc::Role::kLearner, rpc::Role::kClient}) {
      const absl::Status s = Configure(self);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << address << ": " << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "coordinator.address")) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), address)) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "security.tls_ca_file")) << s;
      // Refused means no token stays configured for any channel.
      EXPECT_TRUE(rpc::TokenMayTravelTo(address));
    }
  }
  for (const char* address : {"127.0.0.1:50051", "localhost:50051", "[::1]:50051"}) {
    config_.coordinator.address = address;
    EXPECT_TRUE(Configure(rpc::Role::kActor).ok()) << address;
    EXPECT_TRUE(rpc::TokenMayTravelTo(address)) << address;
    // NewChannel keeps the token off a target that is not loopback.
    EXPECT_FALSE(rpc::TokenMayTravelTo("10.0.0.5:50051"));
  }
}

TEST_F(RoleSecurityTest, AnActorChecksEveryServerItCalls) {
  config_.coordinator.address = "127.0.0.1:50051";
  // Rewards and environments are user-written: no role token goes to them, so a remote one is
  // no reason to refuse; a credential configured for one must not travel in plaintext.
  config_.coordinator.reward_addresses = {"verifier.internal:50071"};
  config_.coordinator.env_addresses = {"sandbox.internal:7000"};
  EXPECT_TRUE(Configure(rpc::Role::kActor).ok());
  config_.security.service_token_files["sandbox.internal:7000"] = "/no/such/file";
  absl::Status s = Configure(rpc::Role::kActor);
  EXPECT_TRUE(
      absl::StrContains(s.message(), "security.service_token_files['sandbox.internal:7000']"))
      << s;
  EXPECT_TRUE(Configure(rpc::Role::kLearner).ok()) << "only actors call user-written services";
  config_.security.service_token_files.clear();
  config_.coordinator.reward_addresses.clear();
  config_.coordinator.env_addresses.clear();
  config_.replay.address = "replay.prl.svc:50061";
  s = Configure(rpc::Role::kActor);
  EXPECT_TRUE(absl::StrContains(s.message(), "replay.address")) << s;
  config_.replay.address.clear();
  config_.broadcast.transport = config::WeightTransport::kGrpc;
  config_.broadcast.address = "learner.prl.svc:50062";
  s = Configure(rpc::Role::kActor);
  EXPECT_TRUE(absl::StrContains(s.message(), "broadcast.address")) << s;
  // Without a token there is nothing to leak: plaintext to any address is the servers' call.
  config_.security = {};
  EXPECT_TRUE(Configure(rpc::Role::kActor).ok());
}

// {rank} (a run of adapters' learner ranks on nodes of their own) stands for every rank's
// server: each one is checked, so a rank whose address is not loopback is refused by name.
TEST_F(RoleSecurityTest, AnActorChecksEveryLearnerRanksAddress) {
  config_.coordinator.address = "127.0.0.1:50051";
  config_.coordinator.adapters = true;
  config_.learner.world_size = 3;
  config_.replay.address = "127.0.{rank}.1:50061";  // ranks 0, 1, 2: all loopback
  EXPECT_TRUE(Configure(rpc::Role::kActor).ok());
  config_.replay.address = "10.0.0.{rank}:50061";
  const absl::Status s = Configure(rpc::Role::kActor);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "replay.address '10.0.0.0:50061'")) << s;
  config_.replay.address.clear();
  config_.broadcast.transport = config::WeightTransport::kGrpc;
  config_.broadcast.address = "127.0.0.1:5006{rank}";
  EXPECT_TRUE(Configure(rpc::Role::kActor).ok());
  config_.broadcast.address = "learner-{rank}.prl.svc:50062";
  EXPECT_TRUE(absl::StrContains(Configure(rpc::Role::kActor).message(),
                                "broadcast.address 'learner-0.prl.svc:50062'"));
}

}  // namespace
}  // namespace prl::roles
