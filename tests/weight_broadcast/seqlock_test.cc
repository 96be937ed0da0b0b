// The two-slot seqlock that the shm and cuda_ipc segments share: a reader that races a writer
// never accepts a torn payload, sees versions in increasing order, and a writer that died
// mid-write leaves the previous version readable and the next writer carries on.
#include "weight_broadcast/seqlock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace prl::weight_broadcast_internal {
namespace {

// Two slots and their payloads, as in a segment (here in one process's memory).
struct TwoSlots {
  A64 published{kNothingPublished};
  SeqlockSlot slot[2];
  std::vector<uint64_t> payload[2];

  explicit TwoSlots(size_t words) {
    for (auto& p : payload) p.assign(words, 0);
  }

  void Write(int64_t version) {
    const int s = SlotToWrite(published.load(std::memory_order_relaxed));
    const uint64_t q = BeginSlotWrite(slot[s], version);
    // Word by word through relaxed atomics: a torn read is then a well-defined mix of versions.
    for (auto& w : payload[s]) {
      std::atomic_ref<uint64_t>(w).store(static_cast<uint64_t>(version), std::memory_order_relaxed);
    }
    EndSlotWrite(slot[s], q, published, version, s);
  }

  // One read attempt: the version, or -1 if the slot was busy or the copy was lapped; `torn`
  // counts accepted copies that mix versions.
  int64_t Read(std::vector<uint64_t>* copy, int64_t* torn) {
    const std::optional<SlotRead> r = BeginSlotRead(published, slot[0], slot[1]);
    if (!r.has_value()) return -1;
    for (size_t i = 0; i < copy->size(); ++i) {
      (*copy)[i] = std::atomic_ref<uint64_t>(payload[r->slot][i]).load(std::memory_order_relaxed);
    }
    if (!SlotReadValid(slot[r->slot], *r)) return -1;
    for (uint64_t w : *copy) {
      if (w != static_cast<uint64_t>(r->version)) {
        ++*torn;
        break;
      }
    }
    return r->version;
  }
};

TEST(SeqlockTest, NothingPublishedReadsNothing) {
  TwoSlots slots(4);
  std::vector<uint64_t> copy(4);
  int64_t torn = 0;
  EXPECT_EQ(slots.Read(&copy, &torn), -1);
  slots.Write(7);
  EXPECT_EQ(slots.Read(&copy, &torn), 7);
  EXPECT_EQ(copy, std::vector<uint64_t>(4, 7));
  EXPECT_EQ(PublishedVersion(slots.published.load()), 7);
}

TEST(SeqlockTest, ARacingReaderNeverAcceptsATornPayload) {
  TwoSlots slots(4096);
  constexpr int64_t kLast = 20000;
  std::atomic<bool> done{false};
  int64_t accepted = 0, lapped = 0, torn = 0, out_of_order = 0;
  std::thread reader([&] {
    std::vector<uint64_t> copy(4096);
    int64_t have = -1;
    while (!done.load()) {
      const int64_t v = slots.Read(&copy, &torn);
      if (v < 0) {
        ++lapped;
        continue;
      }
      if (v < have) ++out_of_order;
      have = v;
      ++accepted;
    }
  });
  for (int64_t v = 0; v <= kLast; ++v) slots.Write(v);
  done = true;
  reader.join();
  EXPECT_EQ(torn, 0) << "accepted copies that mixed versions";
  EXPECT_EQ(out_of_order, 0);
  EXPECT_GT(accepted, 0);
  std::printf("%lld reads accepted, %lld busy or lapped\n", static_cast<long long>(accepted),
              static_cast<long long>(lapped));
}

TEST(SeqlockTest, AWriterThatDiedMidWriteLeavesThePreviousVersionReadable) {
  TwoSlots slots(8);
  slots.Write(1);
  slots.Write(2);
  // A writer starts version 3 and dies before EndSlotWrite.
  const int s = SlotToWrite(slots.published.load());
  const uint64_t odd = BeginSlotWrite(slots.slot[s], 3);
  EXPECT_EQ(odd & 1, 1u);
  std::vector<uint64_t> copy(8);
  int64_t torn = 0;
  EXPECT_EQ(slots.Read(&copy, &torn), 2);
  EXPECT_EQ(copy, std::vector<uint64_t>(8, 2));
  // The next writer rewrites the same (odd) slot: its sequence moves to the next odd value, so
  // a reader that saw the dead writer's sequence cannot mistake the new one for it.
  EXPECT_EQ(SlotToWrite(slots.published.load()), s);
  slots.Write(3);
  EXPECT_EQ(slots.slot[s].sequence.load(), odd + 3);
  EXPECT_EQ(slots.Read(&copy, &torn), 3);
  EXPECT_EQ(torn, 0);
}

}  // namespace
}  // namespace prl::weight_broadcast_internal
