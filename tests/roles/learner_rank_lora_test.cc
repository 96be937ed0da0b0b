// CreateLearnerRank (roles/learner_rank.h) reads the starting weights where they are needed:
// every rank when every weight trains; with LoRA only the node's first rank, the others mapping
// the frozen base it writes — and a KL reference of the starting model is that same base (no
// second copy is read). Two ranks as threads of this process over Gloo.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "roles/learner_rank.h"
#include "tests/learner/learner_testing.h"

namespace prl::roles {
namespace {

// How many times each rank read the starting weights.
std::vector<int> LoadsPerRank(const config::LearnerSection& section) {
  const ModelConfig model = learner::testing::TinyConfig();
  const std::vector<float> values = learner::testing::RandomParameters(model, 3);
  learner::testing::ScratchDir store("learner_rank_lora");
  std::vector<int> loads(section.world_size, 0);
  std::vector<absl::Status> status(section.world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < section.world_size; ++rank) {
    threads.emplace_back([&, rank] {
      omp_set_num_threads(1);
      collective::RendezvousConfig rendezvous;
      rendezvous.rank = rank;
      rendezvous.world_size = section.world_size;
      rendezvous.file_store_dir = store.path();
      rendezvous.timeout = absl::Seconds(30);
      std::optional<ParameterSet> weights;
      auto load = [&]() -> absl::StatusOr<const ParameterSet*> {
        ++loads[rank];
        if (!weights.has_value()) {
          weights = *ParameterSet::Allocate(model, Device::Cpu(), false);
          std::copy(values.begin(), values.end(), weights->data());
        }
        return &*weights;
      };
      LearnerRankOptions options;
      options.frozen_base_dir = store.path();
      absl::StatusOr<std::unique_ptr<LearnerRank>> r =
          CreateLearnerRank(section, options, model, load, rendezvous);
      status[rank] = r.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
  return loads;
}

TEST(LearnerRankLoraTest, OnlyTheNodesFirstRankReadsTheBaseOfALoraLearner) {
  unsetenv("LOCAL_RANK");  // rank 0 is the node's first
  config::LearnerSection full;
  full.world_size = 2;
  EXPECT_EQ(LoadsPerRank(full), (std::vector<int>{1, 1})) << "every rank shards the weights";

  config::LearnerSection lora = full;
  lora.lora_rank = 4;
  EXPECT_EQ(LoadsPerRank(lora), (std::vector<int>{1, 0}));

  config::LearnerSection lora_kl = lora;
  lora_kl.kl_coef = 0.1;
  EXPECT_EQ(LoadsPerRank(lora_kl), (std::vector<int>{1, 0}))
      << "the KL reference of the starting model is the mapped base";
}

}  // namespace
}  // namespace prl::roles
