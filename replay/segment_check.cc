#include "replay/segment_check.h"

#include "absl/strings/str_cat.h"

namespace prl::replay_internal {

namespace {

absl::Status Damaged(const std::string& name, absl::string_view field, absl::string_view expected,
                     uint64_t found) {
  return absl::DataLossError(absl::StrCat("replay segment '", name, "' is damaged: ", field, " is ",
                                          found, ", expected ", expected, "; `prl replay reset ",
                                          name, "` removes it"));
}

// An array of `count` entries of `entry_bytes` at `offset` ends by `limit`.
bool Fits(uint64_t offset, uint64_t count, uint64_t entry_bytes, uint64_t limit) {
  return offset <= limit && count <= (limit - offset) / entry_bytes;
}

// Every live frame from tail to head: aligned, self-describing, never wrapping. Counts the
// frames in each state into `states` (indexed by FrameState).
absl::Status CheckFrames(const Segment& s, const std::string& name, uint64_t states[8]) {
  const Header& h = s.header();
  const FixedHeader& f = h.fixed;
  const uint64_t head = h.head.load();
  for (uint64_t p = h.tail.load(); p < head;) {
    const FrameHeader& fh = s.Frame(p);
    const std::string at = absl::StrCat("the frame at ring position ", p);
    if (fh.position.load() != p) {
      return Damaged(name, at + ": position", "its own", fh.position.load());
    }
    const uint64_t bytes = fh.frame_bytes.load();
    if (bytes < kFrameAlign || bytes % kFrameAlign != 0 ||
        p % f.data_bytes + bytes > f.data_bytes || bytes > head - p) {
      return Damaged(name, at + ": frame_bytes",
                     "a multiple of 128 that ends inside the ring and by its head", bytes);
    }
    const uint64_t state = fh.state.load();
    if (state < kWriting || state > kPadding) {
      return Damaged(name, at + ": state", "a frame state in [1, 7]", state);
    }
    if (state != kPadding && fh.payload_bytes.load() > bytes - sizeof(FrameHeader)) {
      return Damaged(name, at + ": payload_bytes", "at most its frame less its header",
                     fh.payload_bytes.load());
    }
    ++states[state];
    p += bytes;
  }
  return absl::OkStatus();
}

// Ready-queue entries name committed frames; active slots name frames in their state.
absl::Status CheckQueueAndSlots(const Segment& s, const std::string& name,
                                const uint64_t states[8]) {
  const Header& h = s.header();
  const FixedHeader& f = h.fixed;
  auto live = [&](uint64_t p, uint64_t state) {
    return p >= h.tail.load() && p < h.head.load() && p % kFrameAlign == 0 &&
           s.Frame(p).position.load() == p && s.Frame(p).state.load() == state;
  };
  for (uint64_t i = h.queue_head.load(); i != h.queue_tail.load(); ++i) {
    if (!live(s.QueueEntry(i).load(), kCommitted)) {
      return Damaged(name, absl::StrCat("ready queue entry ", i), "the position of a ready group",
                     s.QueueEntry(i).load());
    }
  }
  uint64_t leased = 0, writing = 0;
  for (uint64_t slot = 0; slot < f.max_leases; ++slot) {
    const LeaseSlot& l = s.Lease(slot);
    if (l.active.load() == 0) continue;
    ++leased;
    if (!live(l.frame_position.load(), kLeased)) {
      return Damaged(name, absl::StrCat("lease slot ", slot, " frame_position"),
                     "the position of a leased group", l.frame_position.load());
    }
  }
  for (uint64_t slot = 0; slot < f.max_writers; ++slot) {
    const WriterSlot& w = s.Writer(slot);
    if (w.active.load() == 0) continue;
    ++writing;
    if (!live(w.frame_position.load(), kWriting)) {
      return Damaged(name, absl::StrCat("writer slot ", slot, " frame_position"),
                     "the position of a group being written", w.frame_position.load());
    }
  }
  const uint64_t ready = h.queue_tail.load() - h.queue_head.load();
  if (states[kCommitted] != ready) {
    return Damaged(name, "the ready queue's length",
                   absl::StrCat(states[kCommitted], " (the committed frames)"), ready);
  }
  if (leased != h.leased.load() || states[kLeased] != leased) {
    return Damaged(name, "leased",
                   absl::StrCat(leased, " active lease slots and as many leased frames"),
                   h.leased.load());
  }
  if (writing != h.writing.load() || states[kWriting] != writing) {
    return Damaged(name, "writing",
                   absl::StrCat(writing, " active writer slots and as many frames being written"),
                   h.writing.load());
  }
  if (h.live_frames.load() != ready + leased + writing) {
    return Damaged(name, "live_frames",
                   absl::StrCat(ready + leased + writing, " (ready + leased + writing)"),
                   h.live_frames.load());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFixedHeader(const FixedHeader& f, uint64_t mapped_bytes,
                              const std::string& name) {
  const uint64_t end = f.segment_bytes;
  if (end != mapped_bytes) return Damaged(name, "segment_bytes", "the mapping's size", end);
  if (f.backpressure > 1)
    return Damaged(name, "backpressure", "0 (block) or 1 (drop oldest)", f.backpressure);
  if (f.queue_offset < sizeof(Header) || f.queue_offset % 8 != 0) {
    return Damaged(name, "queue_offset", "8-aligned, after the header", f.queue_offset);
  }
  if (f.queue_capacity < 1 || !Fits(f.queue_offset, f.queue_capacity, 8, f.lease_offset)) {
    return Damaged(name, "queue_capacity", "at least 1, the queue ending by lease_offset",
                   f.queue_capacity);
  }
  if (f.lease_offset % 8 != 0 || f.max_leases < 1 || f.max_leases > (1u << 20) ||
      !Fits(f.lease_offset, f.max_leases, sizeof(LeaseSlot), f.writer_offset)) {
    return Damaged(name, "max_leases", "in [1, 2^20], the slots ending by writer_offset",
                   f.max_leases);
  }
  if (f.writer_offset % 8 != 0 || f.max_writers < 1 || f.max_writers > (1u << 16) ||
      !Fits(f.writer_offset, f.max_writers, sizeof(WriterSlot), f.data_offset)) {
    return Damaged(name, "max_writers", "in [1, 65536], the slots ending by data_offset",
                   f.max_writers);
  }
  if (f.data_offset % kFrameAlign != 0 || f.data_offset > end) {
    return Damaged(name, "data_offset", "128-aligned, inside the segment", f.data_offset);
  }
  if (f.data_bytes < (1u << 16) || f.data_bytes % kFrameAlign != 0 ||
      f.data_bytes != end - f.data_offset) {
    return Damaged(name, "data_bytes", "a multiple of 128 of at least 65536 that ends the segment",
                   f.data_bytes);
  }
  if (f.lease_ns < 1'000'000) return Damaged(name, "lease_ns", ">= 1 ms", f.lease_ns);
  return absl::OkStatus();
}

absl::Status CheckState(const Segment& s, const std::string& name) {
  const Header& h = s.header();
  const FixedHeader& f = h.fixed;
  const uint64_t head = h.head.load(), tail = h.tail.load();
  if (tail > head || head - tail > f.data_bytes || head % kFrameAlign != 0 ||
      tail % kFrameAlign != 0) {
    return Damaged(name, absl::StrCat("head (tail is ", tail, ")"),
                   "128-aligned, at most data_bytes ahead of tail", head);
  }
  const uint64_t qhead = h.queue_head.load(), qtail = h.queue_tail.load();
  if (qtail - qhead > f.queue_capacity) {
    return Damaged(name, absl::StrCat("queue_tail (queue_head is ", qhead, ")"),
                   absl::StrCat("at most queue_capacity (", f.queue_capacity, ") ahead"), qtail);
  }
  const uint64_t dnext = h.dropped.next.load(), dhanded = h.dropped.handed.load();
  if (dhanded > dnext || dnext - dhanded > kDroppedCapacity) {
    return Damaged(name, absl::StrCat("dropped.next (dropped.handed is ", dhanded, ")"),
                   absl::StrCat("at most ", kDroppedCapacity, " ahead"), dnext);
  }
  uint64_t states[8] = {};
  if (absl::Status frames = CheckFrames(s, name, states); !frames.ok()) return frames;
  return CheckQueueAndSlots(s, name, states);
}

}  // namespace prl::replay_internal
