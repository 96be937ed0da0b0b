#include "replay/segment.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/process_identity.h"

namespace prl::replay_internal {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {
constexpr int64_t kMaintenancePeriodNs = 10'000'000;
}  // namespace

FrameHeader& Segment::Frame(uint64_t position) const {
  const FixedHeader& f = h_->fixed;
  return *reinterpret_cast<FrameHeader*>(base_ + f.data_offset + position % f.data_bytes);
}

A64& Segment::QueueEntry(uint64_t index) const {
  const FixedHeader& f = h_->fixed;
  return reinterpret_cast<A64*>(base_ + f.queue_offset)[index % f.queue_capacity];
}

LeaseSlot& Segment::Lease(uint64_t slot) const {
  return reinterpret_cast<LeaseSlot*>(base_ + h_->fixed.lease_offset)[slot];
}

WriterSlot& Segment::Writer(uint64_t slot) const {
  return reinterpret_cast<WriterSlot*>(base_ + h_->fixed.writer_offset)[slot];
}

void Segment::PushBack(LockedSection& lock, uint64_t position) {
  const uint64_t tail = h_->queue_tail.load();
  PRL_CHECK(tail - h_->queue_head.load() < h_->fixed.queue_capacity, "ready queue overflow");
  lock.Set(QueueEntry(tail), position);
  lock.Set(h_->queue_tail, tail + 1);
}

void Segment::PushFront(LockedSection& lock, uint64_t position) {
  PRL_CHECK(QueueSize() < h_->fixed.queue_capacity, "ready queue overflow");
  const uint64_t head = h_->queue_head.load() - 1;
  lock.Set(QueueEntry(head), position);
  lock.Set(h_->queue_head, head);
}

void Segment::WriteFrameHeader(LockedSection& lock, uint64_t position, uint64_t frame_bytes,
                               FrameState state) {
  FrameHeader& fh = Frame(position);
  lock.Set(fh.position, position);
  lock.Set(fh.frame_bytes, frame_bytes);
  lock.Set(fh.state, state);
}

void Segment::DropFront(LockedSection& lock) {
  const uint64_t head = h_->queue_head.load();
  FrameHeader& fh = Frame(QueueEntry(head).load());
  lock.Set(h_->queue_head, head + 1);
  lock.Set(fh.state, kDropped);
  lock.Set(h_->live_frames, h_->live_frames.load() - 1);
  lock.Add(h_->counters.dropped_full, 1);
  // Its prompt waits in the ring for a reader to hand it back (never to be lost silently).
  bool known = false;
  for (const A64& w : fh.prompt_set_id) known = known || w.load() != 0;
  if (!known) return;
  DroppedRing& d = h_->dropped;
  const uint64_t next = d.next.load();
  if (next - d.handed.load() >= kDroppedCapacity) {  // full: the oldest entry is overwritten
    lock.Set(d.handed, next - kDroppedCapacity + 1);
    lock.Add(d.overwritten, 1);
  }
  DroppedPromptEntry& e = d.entries[next % kDroppedCapacity];
  lock.Set(e.prompt_index, fh.prompt_index.load());
  for (int i = 0; i < kPromptSetIdWords; ++i) lock.Set(e.prompt_set_id[i], fh.prompt_set_id[i].load());
  lock.Set(d.next, next + 1);
}

std::vector<Segment::FramePrompt> Segment::DroppedPrompts(size_t max, uint64_t* through) const {
  const DroppedRing& d = h_->dropped;
  std::vector<FramePrompt> out;
  uint64_t i = d.handed.load();
  for (const uint64_t next = d.next.load(); i < next && out.size() < max; ++i) {
    const DroppedPromptEntry& e = d.entries[i % kDroppedCapacity];
    FramePrompt& p = out.emplace_back();
    p.index = e.prompt_index.load();
    for (int w = 0; w < kPromptSetIdWords; ++w) p.set_id[w] = e.prompt_set_id[w].load();
  }
  *through = i;
  return out;
}

void Segment::ForgetDroppedPrompts(LockedSection& lock, uint64_t through) {
  DroppedRing& d = h_->dropped;
  // Entries overwritten meanwhile moved `handed` past some of them already.
  if (through > d.handed.load() && through <= d.next.load()) lock.Set(d.handed, through);
}

uint64_t Segment::ReclaimTail(LockedSection& lock) {
  uint64_t tail = h_->tail.load();
  const uint64_t head = h_->head.load(), start = tail;
  while (tail < head) {
    const FrameHeader& fh = Frame(tail);
    PRL_CHECK(fh.position.load() == tail, "replay segment corrupted: frame at ", tail,
              " claims position ", fh.position.load());
    const uint64_t state = fh.state.load();
    if (state != kConsumed && state != kDropped && state != kAbandoned && state != kPadding) break;
    tail += fh.frame_bytes.load();
  }
  if (tail != start) lock.Set(h_->tail, tail);
  return tail - start;
}

Step Segment::TryAllocate(LockedSection& lock, uint64_t frame_bytes, uint64_t payload_bytes,
                          uint64_t group_key, uint64_t num_records, const FramePrompt& prompt,
                          Allocation* out) {
  const FixedHeader& f = h_->fixed;
  const bool drop_oldest = f.backpressure == 1;
  if (h_->writing.load() >= f.max_writers) return Step::kNone;
  while (h_->live_frames.load() >= f.queue_capacity) {
    if (!drop_oldest || QueueSize() == 0) return Step::kNone;
    if (!lock.HasRoom()) return Step::kYield;
    DropFront(lock);
  }
  // Room for `bytes` more at the head, dropping the oldest ready groups under kDropOldest.
  auto make_room = [&](uint64_t bytes) {
    while (f.data_bytes - (h_->head.load() - h_->tail.load()) < bytes) {
      if (!drop_oldest || QueueSize() == 0) return Step::kNone;
      if (!lock.HasRoom()) return Step::kYield;
      DropFront(lock);
      ReclaimTail(lock);
    }
    return Step::kDone;
  };
  const uint64_t offset = h_->head.load() % f.data_bytes;
  if (offset + frame_bytes > f.data_bytes) {
    // The frame would wrap: pad to the ring's end first (the padding is reclaimable at once,
    // so even a frame as large as the ring fits once the ring drains).
    const uint64_t pad = f.data_bytes - offset;
    if (const Step room = make_room(pad); room != Step::kDone) return room;
    WriteFrameHeader(lock, h_->head.load(), pad, kPadding);
    lock.Set(h_->head, h_->head.load() + pad);
    ReclaimTail(lock);
  }
  if (const Step room = make_room(frame_bytes); room != Step::kDone) return room;
  const uint64_t head = h_->head.load();
  // A free writer slot (there is one: writing < max_writers).
  uint64_t slot = h_->writer_hint.load();
  while (Writer(slot % f.max_writers).active.load() != 0) ++slot;
  slot %= f.max_writers;
  const uint64_t me = SelfProcessToken();
  FrameHeader& fh = Frame(head);
  WriteFrameHeader(lock, head, frame_bytes, kWriting);
  lock.Set(fh.owner, me);
  lock.Set(fh.payload_bytes, payload_bytes);
  lock.Set(fh.group_key, group_key);
  lock.Set(fh.num_records, num_records);
  lock.Set(fh.prompt_index, prompt.index);
  for (int i = 0; i < kPromptSetIdWords; ++i) lock.Set(fh.prompt_set_id[i], prompt.set_id[i]);
  lock.Set(fh.writer_slot, slot);
  WriterSlot& w = Writer(slot);
  lock.Set(w.frame_position, head);
  lock.Set(w.owner, me);
  lock.Set(w.active, 1);
  lock.Set(h_->writer_hint, slot + 1);
  lock.Set(h_->writing, h_->writing.load() + 1);
  lock.Set(h_->live_frames, h_->live_frames.load() + 1);
  lock.Set(h_->head, head + frame_bytes);
  out->position = head;
  out->writer_slot = slot;
  return Step::kDone;
}

void Segment::Commit(LockedSection& lock, const Allocation& a, uint64_t checksum,
                     int64_t min_version) {
  FrameHeader& fh = Frame(a.position);
  lock.Set(fh.checksum, checksum);
  lock.Set(fh.min_version, static_cast<uint64_t>(min_version));
  lock.Set(fh.committed_ns, static_cast<uint64_t>(SteadyNowNs()));
  lock.Set(fh.state, kCommitted);
  lock.Set(Writer(a.writer_slot).active, 0);
  lock.Set(h_->writing, h_->writing.load() - 1);
  PushBack(lock, a.position);
  Counters& c = h_->counters;
  lock.Add(c.groups_in, 1);
  lock.Add(c.records_in, fh.num_records.load());
  lock.Add(c.bytes_in, fh.payload_bytes.load());
}

void Segment::Abort(LockedSection& lock, const Allocation& a) {
  lock.Set(Frame(a.position).state, kAbandoned);
  lock.Set(Writer(a.writer_slot).active, 0);
  lock.Set(h_->writing, h_->writing.load() - 1);
  lock.Set(h_->live_frames, h_->live_frames.load() - 1);
  ReclaimTail(lock);
}

Step Segment::TryLease(LockedSection& lock, int64_t learner_version, int64_t max_lag,
                       LeaseGrant* out) {
  const FixedHeader& f = h_->fixed;
  while (QueueSize() > 0) {
    if (h_->leased.load() >= f.max_leases) return Step::kNone;
    if (!lock.HasRoom()) return Step::kYield;
    const uint64_t qhead = h_->queue_head.load();
    const uint64_t position = QueueEntry(qhead).load();
    FrameHeader& fh = Frame(position);
    PRL_CHECK(fh.position.load() == position && fh.state.load() == kCommitted,
              "replay segment corrupted: ready queue entry ", position, " is not a ready group");
    lock.Set(h_->queue_head, qhead + 1);
    const int64_t min_version = static_cast<int64_t>(fh.min_version.load());
    if (min_version != INT64_MAX && learner_version - min_version > max_lag) {
      lock.Set(fh.state, kDropped);
      lock.Set(h_->live_frames, h_->live_frames.load() - 1);
      lock.Add(h_->counters.dropped_stale, 1);
      continue;
    }
    uint64_t slot = h_->lease_hint.load();
    while (Lease(slot % f.max_leases).active.load() != 0) ++slot;
    slot %= f.max_leases;
    LeaseSlot& l = Lease(slot);
    const uint64_t generation = l.generation.load() + 1;
    lock.Set(l.frame_position, position);
    lock.Set(l.holder, SelfProcessToken());
    lock.Set(l.deadline_ns, static_cast<uint64_t>(SteadyNowNs() + f.lease_ns));
    lock.Set(l.generation, generation);
    lock.Set(l.active, 1);
    lock.Set(h_->lease_hint, slot + 1);
    lock.Set(h_->leased, h_->leased.load() + 1);
    lock.Set(fh.state, kLeased);
    lock.Set(fh.lease_slot, slot);
    *out = {position, slot, generation};
    return Step::kDone;
  }
  return Step::kNone;
}

LeaseSlot* Segment::HeldLease(uint64_t position, uint64_t slot, uint64_t generation) const {
  if (slot >= h_->fixed.max_leases) return nullptr;
  LeaseSlot& l = Lease(slot);
  if (l.active.load() == 0 || l.generation.load() != generation ||
      l.frame_position.load() != position || l.holder.load() != SelfProcessToken()) {
    return nullptr;
  }
  return &l;
}

bool Segment::RenewLease(LockedSection& lock, uint64_t position, uint64_t slot,
                         uint64_t generation) {
  LeaseSlot* l = HeldLease(position, slot, generation);
  if (l == nullptr) return false;
  lock.Set(l->deadline_ns, static_cast<uint64_t>(SteadyNowNs() + h_->fixed.lease_ns));
  return true;
}

bool Segment::EndLease(LockedSection& lock, uint64_t position, uint64_t slot, uint64_t generation,
                       bool consumed) {
  LeaseSlot* held = HeldLease(position, slot, generation);
  if (held == nullptr) return false;
  LeaseSlot& l = *held;
  FrameHeader& fh = Frame(position);
  lock.Set(l.active, 0);
  lock.Set(h_->leased, h_->leased.load() - 1);
  if (consumed) {
    lock.Set(fh.state, kConsumed);
    lock.Set(h_->live_frames, h_->live_frames.load() - 1);
    Counters& c = h_->counters;
    lock.Add(c.groups_out, 1);
    lock.Add(c.records_out, fh.num_records.load());
    lock.Add(c.bytes_out, fh.payload_bytes.load());
    ReclaimTail(lock);
  } else {
    lock.Set(fh.state, kCommitted);
    PushFront(lock, position);
  }
  return true;
}

bool Segment::Maintain(LockedSection& lock, bool force) {
  const int64_t now = SteadyNowNs();
  if (!force && now - static_cast<int64_t>(h_->last_maintenance_ns.load()) < kMaintenancePeriodNs) {
    return false;
  }
  lock.Set(h_->last_maintenance_ns, static_cast<uint64_t>(now));
  const FixedHeader& f = h_->fixed;
  std::unordered_map<uint64_t, bool> alive;  // one /proc lookup per process
  auto is_alive = [&](uint64_t token) {
    auto it = alive.find(token);
    if (it == alive.end()) it = alive.emplace(token, ProcessAlive(token)).first;
    return it->second;
  };
  bool changed = false;
  if (h_->leased.load() > 0) {
    std::vector<uint64_t> reclaimed;  // frame positions, to go back in the order they came
    // Each reclaimed lease also costs a PushFront (2 fields) after the loop: counted as
    // pending so that the whole section stays within the undo log. Leases left over expire
    // in the next section (then not in order with these: only past thousands at once).
    for (uint64_t s = 0; s < f.max_leases && lock.HasRoom(2 * reclaimed.size()); ++s) {
      LeaseSlot& l = Lease(s);
      if (l.active.load() == 0) continue;
      if (static_cast<int64_t>(l.deadline_ns.load()) > now && is_alive(l.holder.load())) continue;
      FrameHeader& fh = Frame(l.frame_position.load());
      lock.Set(l.active, 0);
      lock.Set(h_->leased, h_->leased.load() - 1);
      lock.Set(fh.state, kCommitted);
      reclaimed.push_back(l.frame_position.load());
      lock.Add(h_->counters.redelivered, 1);
      changed = true;
    }
    // Oldest first, ahead of everything newer: pushed to the front newest first. A restarted
    // learner then reads them in the order the dead one did (learner/step_journal.h).
    std::sort(reclaimed.begin(), reclaimed.end(), std::greater<uint64_t>());
    for (const uint64_t position : reclaimed) PushFront(lock, position);
  }
  if (h_->writing.load() > 0) {
    for (uint64_t s = 0; s < f.max_writers && lock.HasRoom(); ++s) {
      WriterSlot& w = Writer(s);
      if (w.active.load() == 0 || is_alive(w.owner.load())) continue;
      FrameHeader& fh = Frame(w.frame_position.load());
      lock.Set(w.active, 0);
      lock.Set(h_->writing, h_->writing.load() - 1);
      lock.Set(fh.state, kAbandoned);
      lock.Set(h_->live_frames, h_->live_frames.load() - 1);
      lock.Add(h_->counters.abandoned_writes, 1);
      changed = true;
    }
  }
  // Stopped for the section's undo budget: the next call goes on at once, not in 10 ms.
  if (!lock.HasRoom()) lock.Set(h_->last_maintenance_ns, 0);
  return ReclaimTail(lock) > 0 || changed;
}

}  // namespace prl::replay_internal
