// replay_fill: writes deterministic rollout groups into a replay segment (created if missing),
// so that a learner reading it trains on the same groups in the same order every time
// (tests/e2e/learner_kill_test.py: a learner killed -9 and resumed against one never killed).
//
// usage: replay_fill SEGMENT RUN_ID GROUPS SAMPLES VOCAB SEED
//   group g: prompt g of prompt set "kill-test" (group id g + 1), SAMPLES samples of 4 prompt
//   and 6 completion tokens drawn from [0, VOCAB) by SEED, behaviour log-probs in [-3, -0.5],
//   token version 0, reward 1 for odd samples (so every group has an advantage).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "replay/replay_buffer.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s SEGMENT RUN_ID GROUPS SAMPLES VOCAB SEED\n", argv[0]);
    return 2;
  }
  const std::string segment = argv[1], run_id = argv[2];
  const int groups = std::atoi(argv[3]), samples = std::atoi(argv[4]), vocab = std::atoi(argv[5]);
  std::mt19937 rng(static_cast<uint32_t>(std::atoi(argv[6])));
  absl::StatusOr<std::unique_ptr<prl::ReplayBuffer>> buffer = prl::ReplayBuffer::Open(segment);
  if (!buffer.ok()) {
    prl::ReplayConfig config;
    config.capacity_bytes = int64_t{64} << 20;
    buffer = prl::ReplayBuffer::Create(segment, config);
  }
  if (!buffer.ok()) {
    std::fprintf(stderr, "replay_fill: %s\n", std::string(buffer.status().message()).c_str());
    return 1;
  }
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::uniform_real_distribution<float> logprob(-3.0f, -0.5f);
  for (int g = 0; g < groups; ++g) {
    std::vector<prl::RolloutRecord> group(samples);
    for (int i = 0; i < samples; ++i) {
      prl::RolloutRecord& r = group[i];
      r.run_id = run_id;
      r.prompt_set_id = "kill-test";
      r.actor_id = "replay-fill";
      r.prompt_index = static_cast<uint64_t>(g);
      r.group_id = static_cast<uint64_t>(g) + 1;
      r.sample_index = static_cast<uint32_t>(i);
      r.group_size = static_cast<uint32_t>(samples);
      for (int t = 0; t < 4; ++t) r.prompt_tokens.push_back(token(rng));
      for (int t = 0; t < 6; ++t) {
        r.completion_tokens.push_back(token(rng));
        r.behaviour_logprobs.push_back(logprob(rng));
        r.token_versions.push_back(0);
      }
      r.reward = i % 2;
    }
    const absl::Status written = (*buffer)->WriteGroup(group, absl::Seconds(30));
    if (!written.ok()) {
      std::fprintf(stderr, "replay_fill: group %d: %s\n", g,
                   std::string(written.message()).c_str());
      return 1;
    }
  }
  return 0;
}
