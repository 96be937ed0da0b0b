// RendezvousFromEnv and ValidateRendezvous: the torchrun variables are read, and every
// missing or malformed one is an error naming the variable, what was expected and what was
// found.
#include "collective/rendezvous.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/status_testing.h"

namespace prl::collective {
namespace {

using ::prl::testing::IsError;

class RendezvousEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Set("RANK", "1");
    Set("WORLD_SIZE", "3");
    Set("MASTER_ADDR", "10.1.2.3");
    Set("MASTER_PORT", "29511");
  }
  void TearDown() override {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
  }
  static void Set(const char* name, const char* value) { setenv(name, value, 1); }
};

TEST_F(RendezvousEnvTest, ReadsTheTorchrunVariables) {
  absl::StatusOr<RendezvousConfig> config = RendezvousFromEnv();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 1);
  EXPECT_EQ(config->world_size, 3);
  EXPECT_EQ(config->master_addr, "10.1.2.3");
  EXPECT_EQ(config->master_port, 29511);
  EXPECT_TRUE(config->file_store_dir.empty());
}

TEST_F(RendezvousEnvTest, MissingRankNamesTheVariable) {
  unsetenv("RANK");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"environment variable RANK is not set", "0 <= RANK < WORLD_SIZE"}));
}

TEST_F(RendezvousEnvTest, MissingMasterAddrNamesTheVariable) {
  unsetenv("MASTER_ADDR");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"MASTER_ADDR is not set"}));
}

TEST_F(RendezvousEnvTest, ZeroWorldSizeIsAnError) {
  Set("RANK", "0");
  Set("WORLD_SIZE", "0");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"WORLD_SIZE=0", ">= 1"}));
}

TEST_F(RendezvousEnvTest, RankAtLeastWorldSizeIsAnError) {
  Set("RANK", "3");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"RANK=3", "WORLD_SIZE=3", "0 <= RANK < WORLD_SIZE"}));
}

TEST_F(RendezvousEnvTest, NonNumericPortIsAnError) {
  Set("MASTER_PORT", "abc");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"MASTER_PORT='abc' is not an integer", "1..65535"}));
}

TEST_F(RendezvousEnvTest, OutOfRangePortIsAnError) {
  Set("MASTER_PORT", "70000");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"MASTER_PORT=70000", "1..65535"}));
}

TEST_F(RendezvousEnvTest, NonNumericRankIsAnError) {
  Set("RANK", "1.5");
  EXPECT_TRUE(IsError(RendezvousFromEnv().status(), absl::StatusCode::kInvalidArgument,
                      {"RANK='1.5' is not an integer"}));
}

TEST(ValidateRendezvousTest, ChecksEveryField) {
  RendezvousConfig config;
  EXPECT_TRUE(ValidateRendezvous(config).ok());
  config.rank = -1;
  EXPECT_TRUE(IsError(ValidateRendezvous(config), absl::StatusCode::kInvalidArgument, {"RANK=-1"}));
  config.rank = 0;
  config.master_addr = "";
  EXPECT_TRUE(IsError(ValidateRendezvous(config), absl::StatusCode::kInvalidArgument,
                      {"MASTER_ADDR is empty"}));
  config.master_addr = "127.0.0.1";
  config.master_port = 0;
  EXPECT_TRUE(
      IsError(ValidateRendezvous(config), absl::StatusCode::kInvalidArgument, {"MASTER_PORT=0"}));
  config.file_store_dir = "/tmp/x";
  EXPECT_TRUE(ValidateRendezvous(config).ok()) << "a FileStore needs no port";
  config.timeout = absl::ZeroDuration();
  EXPECT_TRUE(IsError(ValidateRendezvous(config), absl::StatusCode::kInvalidArgument, {"timeout"}));
  config.timeout = absl::Seconds(1);
  config.group_name = "";
  EXPECT_TRUE(
      IsError(ValidateRendezvous(config), absl::StatusCode::kInvalidArgument, {"group_name"}));
}

TEST(ValidateRendezvousTest, AGroupWithAGivenStoreNeedsNoAddressOrPort) {
  RendezvousConfig config;
  config.master_addr = "";
  config.master_port = 0;
  EXPECT_TRUE(ValidateGroup(config).ok());
  config.world_size = 2;
  config.rank = 2;
  EXPECT_TRUE(IsError(ValidateGroup(config), absl::StatusCode::kInvalidArgument,
                      {"RANK=2 is out of range for WORLD_SIZE=2"}));
  config.rank = 1;
  config.group_name = "";
  EXPECT_TRUE(IsError(ValidateGroup(config), absl::StatusCode::kInvalidArgument, {"group_name"}));
}

TEST(LocalAddressFacingTest, LoopbackStaysOnLoopbackAndAnUnknownHostIsNamed) {
  EXPECT_EQ(*LocalAddressFacing("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*LocalAddressFacing("localhost"), "127.0.0.1");
  EXPECT_TRUE(IsError(LocalAddressFacing("no-such-host.invalid").status(),
                      absl::StatusCode::kUnavailable, {"no-such-host.invalid"}));
}

}  // namespace
}  // namespace prl::collective
