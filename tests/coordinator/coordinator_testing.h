// What the coordinator suites share: the settings (a durable log in `dir`, a small vocabulary
// and context, leases that do not expire during a test, any reward accepted), and a fixture
// that gives each test its own log directory and opens coordinators on it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"

namespace prl::coordinator {

inline CoordinatorConfig TestCoordinatorConfig(const std::filesystem::path& dir) {
  CoordinatorConfig c;
  c.log_path = (dir / "prompts.log").string();
  c.vocab_size = 50;
  c.max_position_embeddings = 64;
  c.lease_ms = 60'000;
  c.heartbeat_ms = 1'000;
  c.validate_reward = [](const prl::v1::RewardSpec&) { return absl::OkStatus(); };
  return c;
}

// A test with its own log directory (removed afterwards) and config_ = TestCoordinatorConfig;
// Open() opens a coordinator with config_ as the test has set it (null, and a failure, if not).
class CoordinatorLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("prl_coordinator_suite_", getpid(), "_", counter_++);
    std::filesystem::remove_all(dir_);
    config_ = TestCoordinatorConfig(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Coordinator> Open() {
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(config_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // A lease of up to `n` prompts for `actor`.
  static prl::v1::LeaseRequest LeaseOf(const std::string& actor, int n) {
    prl::v1::LeaseRequest r;
    r.set_actor_id(actor);
    r.set_max_prompts(n);
    return r;
  }

  std::filesystem::path dir_;
  CoordinatorConfig config_;
  static inline int counter_ = 0;
};

}  // namespace prl::coordinator
