// Scheduler: continuous batching with chunked prefill and preemption by recompute (vLLM v1's
// unified scheduler, nano-vllm's names).
//
// Every step spends a token budget (max_num_batched_tokens) first on the running sequences —
// one token each when decoding, the next chunk when a long prompt is still being prefilled —
// then admits waiting sequences in arrival order while the budget, the max_num_seqs slots and
// the free blocks allow. A group's leader reserves slots for all n samples when it is admitted.
// When a running sequence needs a block and none is free, the most recently admitted running
// sequence is preempted: its blocks are released and it returns to the front of the waiting
// queue to be recomputed later, losing nothing (its tokens stay; the sampler's draws depend
// only on seed, sample and position). Progress is guaranteed because the engine admits only
// requests one sequence of which fits in the whole pool, the oldest sequence is never
// preempted by a younger one, and when nothing runs and the first waiting sequence does not
// fit, paused and then other waiting sequences (resumed samples keep their blocks while they
// wait) give their blocks back until it does.
//
// Not thread-safe: driven by the engine's step loop.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "inference_engine/block_manager.h"
#include "inference_engine/sequence.h"

namespace prl {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;              // sequences running at once
  int32_t max_num_batched_tokens = 2048;  // tokens per step (decode + prefill chunks)
};

struct ScheduledChunk {
  Sequence* seq;
  int64_t num_tokens;  // positions [num_computed_tokens, num_computed_tokens + num_tokens)
  bool samples;        // the chunk reaches the last known token: its last row is sampled
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  // (source, destination) blocks to copy before this step writes any K/V (copy-on-write).
  std::vector<std::pair<int32_t, int32_t>> block_copies;
  int64_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager* blocks);

  // Queues a request's leader (or a preempted sequence, at the front).
  void AddWaiting(Sequence* seq, bool front = false);
  SchedulerOutput Schedule();
  // After the step ran: advances num_computed_tokens and caches the blocks it filled.
  void OnStepComputed(const SchedulerOutput& step);
  // The leader's prompt is done: its n-1 followers share its blocks and start running.
  void Fork(Request* request);
  // A sequence ended (stop, length): its blocks are released.
  void Finish(Sequence* seq);
  // A multi-turn sequence's turn ended: it leaves the queues and keeps its blocks; when blocks
  // run short, paused sequences give theirs back (oldest pause first) before any running
  // sequence is preempted, and recompute when they go on.
  void Pause(Sequence* seq);
  // A paused sequence goes on (new tokens appended): it waits to be admitted again, computing
  // only what its kept blocks do not hold.
  void Resume(Sequence* seq);
  // Removes an unfinished sequence from the queues, releasing what it holds.
  void Remove(Sequence* seq);
  // Every running sequence back to waiting and every paused one without its blocks, to be
  // recomputed (e.g. under new weights).
  void PreemptAll();

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  int64_t prefix_cache_hit_tokens() const { return prefix_cache_hit_tokens_; }
  int64_t num_paused() const { return static_cast<int64_t>(paused_.size()); }
  int64_t paused_evictions() const { return paused_evictions_; }  // paused sequences' blocks taken
  int32_t used_slots() const { return used_slots_; }

 private:
  // Slots a sequence holds while running: n for a leader that has not forked yet, else 1.
  int32_t SlotsFor(const Sequence& seq) const;
  // Allocates (and copy-on-writes) the blocks for the next num_tokens positions; all or
  // nothing.
  bool EnsureBlocks(Sequence& seq, int64_t num_tokens,
                    std::vector<std::pair<int32_t, int32_t>>& copies);
  // Shares the cached full blocks of the sequence's prefix (leaving >= 1 token to compute).
  void ApplyPrefixCache(Sequence& seq);
  void ReleaseBlocks(Sequence& seq);
  void Preempt(Sequence* seq);
  // Releases the blocks of the paused sequence paused longest ago that holds any; false if none.
  bool EvictPaused();
  // Releases the blocks of the waiting sequence queued last (other than `keep`) that holds any
  // (a resumed sample); false if none.
  bool EvictWaiting(const Sequence* keep);

  SchedulerConfig config_;
  BlockManager* blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  std::deque<Sequence*> paused_;    // in pause order
  int64_t paused_evictions_ = 0;
  int32_t used_slots_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t prefix_cache_hit_tokens_ = 0;
};

}  // namespace prl
