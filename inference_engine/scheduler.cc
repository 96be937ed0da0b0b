#include "inference_engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace prl {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager* blocks)
    : config_(config), blocks_(blocks) {}

int32_t Scheduler::SlotsFor(const Sequence& seq) const {
  const Request& r = *seq.request;
  return (seq.sample_index == 0 && !r.forked) ? r.params.n : 1;
}

void Scheduler::AddWaiting(Sequence* seq, bool front) {
  seq->status = SequenceStatus::kWaiting;
  if (front) {
    waiting_.push_front(seq);
  } else {
    waiting_.push_back(seq);
  }
}

bool Scheduler::EnsureBlocks(Sequence& seq, int64_t num_tokens,
                             std::vector<std::pair<int32_t, int32_t>>& copies) {
  const int64_t bs = blocks_->block_size();
  const int64_t first = seq.num_computed_tokens / bs;
  const bool cow = first < static_cast<int64_t>(seq.block_table.size()) &&
                   blocks_->ref_count(seq.block_table[first]) > 1;
  const int64_t needed = (seq.num_computed_tokens + num_tokens + bs - 1) / bs;
  const int64_t fresh = std::max<int64_t>(0, needed - static_cast<int64_t>(seq.block_table.size()));
  if (fresh + (cow ? 1 : 0) > blocks_->num_free_blocks()) return false;
  if (cow) {
    const int32_t copy = blocks_->Allocate();
    copies.emplace_back(seq.block_table[first], copy);
    blocks_->Release(seq.block_table[first]);
    seq.block_table[first] = copy;
  }
  for (int64_t i = 0; i < fresh; ++i) seq.block_table.push_back(blocks_->Allocate());
  return true;
}

void Scheduler::ApplyPrefixCache(Sequence& seq) {
  const int64_t bs = blocks_->block_size();
  int64_t max_blocks = (static_cast<int64_t>(seq.tokens.size()) - 1) / bs;
  if (seq.request->route_width > 0) {
    // Routes are recorded from position P - 1 on, for the first time a position is computed: a
    // cached block may cover only positions whose routes this sequence already holds (a paused
    // sample evicted and resumed, whose reply another sequence computed, still computes it).
    const int64_t routed = seq.num_prompt_tokens - 1 +
                           static_cast<int64_t>(seq.routes.size()) / seq.request->route_width;
    max_blocks = std::min(max_blocks, std::max<int64_t>(0, routed) / bs);
  }
  uint64_t hash = seq.request != nullptr ? seq.request->cache_salt : 0;  // per adapter
  for (int64_t b = 0; b < max_blocks; ++b) {
    const absl::Span<const int32_t> block_tokens(seq.tokens.data() + b * bs, bs);
    const uint64_t h = BlockManager::HashBlock(hash, block_tokens);
    const int32_t block = blocks_->Lookup(h, block_tokens);
    if (block < 0) break;
    blocks_->Retain(block);
    seq.block_table.push_back(block);
    hash = h;
  }
  seq.num_computed_tokens = static_cast<int64_t>(seq.block_table.size()) * bs;
  seq.num_hashed_blocks = static_cast<int64_t>(seq.block_table.size());
  seq.last_block_hash = hash;
}

void Scheduler::ReleaseBlocks(Sequence& seq) {
  for (int32_t b : seq.block_table) blocks_->Release(b);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
  seq.num_hashed_blocks = 0;
  seq.last_block_hash = seq.request != nullptr ? seq.request->cache_salt : 0;
}

void Scheduler::Preempt(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  PRL_CHECK(it != running_.end(), "preempting a sequence that is not running");
  running_.erase(it);
  used_slots_ -= SlotsFor(*seq);
  ReleaseBlocks(*seq);
  AddWaiting(seq, /*front=*/true);
  ++num_preemptions_;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    const int64_t n = std::min<int64_t>(
        static_cast<int64_t>(seq->tokens.size()) - seq->num_computed_tokens, budget);
    if (n <= 0) continue;
    bool scheduled = true;
    while (!EnsureBlocks(*seq, n, out.block_copies)) {
      if (EvictPaused()) continue;  // a paused sequence's blocks before a running one's
      Sequence* victim = running_.back();
      Preempt(victim);
      if (victim == seq) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) break;
    out.chunks.push_back(
        {seq, n, seq->num_computed_tokens + n == static_cast<int64_t>(seq->tokens.size())});
    budget -= n;
  }
  while (!waiting_.empty() && budget > 0) {
    Sequence* seq = waiting_.front();
    const int32_t slots = SlotsFor(*seq);
    if (used_slots_ + slots > config_.max_num_seqs) break;
    // A new or preempted sequence looks up the prefix cache; a resumed one brings its blocks.
    const bool cache_lookup = seq->num_computed_tokens == 0 && seq->block_table.empty();
    if (cache_lookup) ApplyPrefixCache(*seq);
    const int64_t n = std::min<int64_t>(
        static_cast<int64_t>(seq->tokens.size()) - seq->num_computed_tokens, budget);
    bool fits = EnsureBlocks(*seq, n, out.block_copies);
    while (!fits && EvictPaused()) fits = EnsureBlocks(*seq, n, out.block_copies);
    // Nothing runs: no block would ever come back unless another waiting sequence (a resumed
    // sample keeps its blocks while it waits) gives its own back.
    while (!fits && running_.empty() && EvictWaiting(seq)) {
      fits = EnsureBlocks(*seq, n, out.block_copies);
    }
    if (!fits) {
      if (cache_lookup) ReleaseBlocks(*seq);  // undo the prefix-cache hits; retry later
      break;
    }
    if (cache_lookup) prefix_cache_hit_tokens_ += seq->num_computed_tokens;
    waiting_.pop_front();
    seq->status = SequenceStatus::kRunning;
    running_.push_back(seq);
    used_slots_ += slots;
    out.chunks.push_back(
        {seq, n, seq->num_computed_tokens + n == static_cast<int64_t>(seq->tokens.size())});
    budget -= n;
  }
  for (const ScheduledChunk& c : out.chunks) out.num_tokens += c.num_tokens;
  return out;
}

void Scheduler::OnStepComputed(const SchedulerOutput& step) {
  const int64_t bs = blocks_->block_size();
  for (const ScheduledChunk& c : step.chunks) {
    Sequence& seq = *c.seq;
    seq.num_computed_tokens += c.num_tokens;
    if (!blocks_->prefix_caching()) continue;
    for (int64_t b = seq.num_hashed_blocks; b < seq.num_computed_tokens / bs; ++b) {
      const absl::Span<const int32_t> block_tokens(seq.tokens.data() + b * bs, bs);
      seq.last_block_hash = BlockManager::HashBlock(seq.last_block_hash, block_tokens);
      blocks_->Register(seq.block_table[b], seq.last_block_hash, block_tokens);
      seq.num_hashed_blocks = b + 1;
    }
  }
}

void Scheduler::Fork(Request* request) {
  Sequence& leader = *request->samples[0];
  request->forked = true;  // the leader's n slots now belong to n sequences
  for (size_t j = 1; j < request->samples.size(); ++j) {
    Sequence& s = *request->samples[j];
    s.block_table = leader.block_table;
    for (int32_t b : s.block_table) blocks_->Retain(b);
    s.num_computed_tokens = leader.num_computed_tokens;
    s.num_hashed_blocks = leader.num_hashed_blocks;
    s.last_block_hash = leader.last_block_hash;
    s.status = SequenceStatus::kRunning;
    running_.push_back(&s);
  }
}

bool Scheduler::EvictWaiting(const Sequence* keep) {
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    Sequence* seq = *it;
    if (seq == keep || seq->block_table.empty()) continue;
    ReleaseBlocks(*seq);
    ++num_preemptions_;
    return true;
  }
  return false;
}

bool Scheduler::EvictPaused() {
  for (Sequence* seq : paused_) {
    if (seq->block_table.empty()) continue;
    ReleaseBlocks(*seq);
    ++paused_evictions_;
    return true;
  }
  return false;
}

void Scheduler::Pause(Sequence* seq) {
  if (seq->status == SequenceStatus::kRunning) {
    auto it = std::find(running_.begin(), running_.end(), seq);
    PRL_CHECK(it != running_.end(), "running sequence missing from the running list");
    running_.erase(it);
    used_slots_ -= SlotsFor(*seq);
  } else if (seq->status == SequenceStatus::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  seq->status = SequenceStatus::kPaused;
  paused_.push_back(seq);
}

void Scheduler::Resume(Sequence* seq) {
  PRL_CHECK(seq->status == SequenceStatus::kPaused, "resuming a sequence that is not paused");
  paused_.erase(std::find(paused_.begin(), paused_.end(), seq));
  AddWaiting(seq);
}

void Scheduler::Finish(Sequence* seq) {
  Remove(seq);
  seq->status = SequenceStatus::kFinished;
}

void Scheduler::Remove(Sequence* seq) {
  if (seq->status == SequenceStatus::kRunning) {
    auto it = std::find(running_.begin(), running_.end(), seq);
    PRL_CHECK(it != running_.end(), "running sequence missing from the running list");
    running_.erase(it);
    used_slots_ -= SlotsFor(*seq);
  } else if (seq->status == SequenceStatus::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);  // unforked followers are in no queue
  } else if (seq->status == SequenceStatus::kPaused) {
    paused_.erase(std::find(paused_.begin(), paused_.end(), seq));
  }
  ReleaseBlocks(*seq);
}

void Scheduler::PreemptAll() {
  while (!running_.empty()) Preempt(running_.back());
  while (EvictPaused()) {
  }
}

}  // namespace prl
