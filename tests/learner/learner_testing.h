// Helpers for the in-process learner tests: a learner group of W ranks as threads of this
// process over Gloo (the in-process twin of learner/local_launcher.h's processes), a tiny
// model, its parameters and token sequences, and shard bookkeeping.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collective/rendezvous.h"
#include "learner/fsdp.h"
#include "model/config.h"
#include "model/packed_batch.h"
#include "model/parameters.h"

namespace prl::learner::testing {

// A fresh directory under the test's temporary directory, removed by the destructor.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    static std::atomic<int> next{0};
    path_ = absl::StrCat(::testing::TempDir(), "/prl_", name, "_", getpid(), "_", next++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs fn(rank, communicators) on `world_size` threads at once, each with one Gloo
// communicator per group in `groups` (a FileStore rendezvous in a scratch directory), and
// returns each rank's status in rank order. Each rank thread runs its kernels on one OpenMP
// thread, as the launcher gives each rank its share of the cores. A rank that fails early leaves
// the others waiting in a collective; the 30 s time-out turns that into an error instead of a
// hang.
inline std::vector<absl::Status> RunRanksInGroups(
    int world_size, const std::vector<std::string>& groups,
    const std::function<absl::Status(int, std::vector<collective::Communicator*>&)>& fn) {
  ScratchDir store("learner_ranks");
  std::vector<absl::Status> status(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      omp_set_num_threads(1);
      collective::RendezvousConfig rendezvous;
      rendezvous.rank = rank;
      rendezvous.world_size = world_size;
      rendezvous.file_store_dir = store.path();
      rendezvous.timeout = absl::Seconds(30);
      collective::CommunicatorOptions options;
      options.timeout = absl::Seconds(30);
      std::vector<std::unique_ptr<collective::Communicator>> owned;
      std::vector<collective::Communicator*> comms;
      for (const std::string& group : groups) {
        rendezvous.group_name = group;
        absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
            collective::ConnectGloo(rendezvous, options);
        if (!comm.ok()) {
          status[rank] = comm.status();
          return;
        }
        comms.push_back(comm->get());
        owned.push_back(*std::move(comm));
      }
      status[rank] = fn(rank, comms);
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

// One communicator per rank (group "default").
inline std::vector<absl::Status> RunRanks(
    int world_size, const std::function<absl::Status(int, collective::Communicator&)>& fn) {
  return RunRanksInGroups(world_size, {"default"},
                          [&](int rank, std::vector<collective::Communicator*>& comms) {
                            return fn(rank, *comms[0]);
                          });
}

// Two communicators per rank (groups "default" and "reference", as the learner connects its
// policy and its reference model of learner.kl_coef).
inline std::vector<absl::Status> RunRanksWithTwoGroups(
    int world_size,
    const std::function<absl::Status(int, collective::Communicator&, collective::Communicator&)>&
        fn) {
  return RunRanksInGroups(world_size, {"default", "reference"},
                          [&](int rank, std::vector<collective::Communicator*>& comms) {
                            return fn(rank, *comms[0], *comms[1]);
                          });
}

// OK when every rank is; otherwise the failures, each named by its rank.
inline absl::Status AllRanksOk(const std::vector<absl::Status>& status) {
  std::string failures;
  for (size_t rank = 0; rank < status.size(); ++rank) {
    if (!status[rank].ok())
      absl::StrAppend(&failures, "rank ", rank, ": ", status[rank].ToString(), "; ");
  }
  return failures.empty() ? absl::OkStatus() : absl::InternalError(failures);
}

// A Qwen2-shaped model small enough that a step takes milliseconds: q/k/v biases, grouped
// KV heads. Its units (embedding 1600 elements, each layer 7808, the final norm 32) are not
// multiples of 3, so world size 3 pads their last shards (untied, the norm and head: 1632).
inline ModelConfig TinyConfig(bool tied = true) {
  ModelConfig c;
  c.arch = Architecture::kQwen2;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.qkv_bias = true;
  return c;
}

// Every parameter ~ U(-0.5, 0.5) (norm weights around 1, biases non-zero): every tensor's
// gradient and every decay decision shows in the result.
inline std::vector<float> RandomParameters(const ModelConfig& config, uint64_t seed) {
  const ParameterLayout layout(config);
  std::vector<float> full(static_cast<size_t>(layout.num_elements()));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (const ParamEntry& e : layout.entries()) {
    const bool norm = e.name.ends_with("norm.weight");
    for (int64_t i = 0; i < e.numel; ++i) full[e.offset + i] = (norm ? 1.0f : 0.0f) + u(rng);
  }
  return full;
}

// Token sequences of varied lengths (1 to 40 scored positions).
inline std::vector<std::vector<int32_t>> RandomSequences(const ModelConfig& config, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<std::vector<int32_t>> sequences;
  for (int len : {2, 17, 41, 5, 23, 9, 30}) {
    std::vector<int32_t> s(len);
    for (auto& t : s) t = tok(rng);
    sequences.push_back(s);
  }
  return sequences;
}

// The sequences whose index is `rank` modulo `world_size`, each scored from position 1.
inline PackedBatch BatchOf(const std::vector<std::vector<int32_t>>& sequences, int rank,
                           int world_size) {
  PackedBatch batch;
  for (size_t i = rank; i < sequences.size(); i += world_size) batch.AddScored(sequences[i], 1);
  return batch;
}

// d(loss)/d(logprob): -1 where a position has a target (maximum likelihood), 0 elsewhere.
inline std::vector<float> MaxLikelihoodGrad(const PackedBatch& batch) {
  std::vector<float> d(batch.num_tokens(), 0.0f);
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    if (batch.targets[t] != PackedBatch::kNoTarget) d[t] = -1.0f;
  }
  return d;
}

// Rank `rank`'s local shard of a full-layout vector, as learner/fsdp.h lays it out: unit u's
// elements [rank s, (rank + 1) s) at its shard_offset, zero past the unit's end.
inline std::vector<float> ShardOf(absl::Span<const float> full, const ModelConfig& config, int rank,
                                  int world_size) {
  const std::vector<UnitShard> plan = PlanShards(ParameterLayout(config), world_size);
  std::vector<float> shard(static_cast<size_t>(ShardElements(plan)), 0.0f);
  for (const UnitShard& u : plan) {
    for (int64_t i = rank * u.shard; i < std::min((rank + 1) * u.shard, u.numel); ++i) {
      shard[u.shard_offset + i - rank * u.shard] = full[u.begin + i];
    }
  }
  return shard;
}

// sqrt(sum (a - b)^2 / sum b^2) over [begin, begin + n).
inline double RelativeDifference(absl::Span<const float> a, absl::Span<const float> b,
                                 int64_t begin, int64_t n) {
  double diff = 0.0, ref = 0.0;
  for (int64_t i = begin; i < begin + n; ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    ref += double{b[i]} * b[i];
  }
  return ref == 0.0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

}  // namespace prl::learner::testing
