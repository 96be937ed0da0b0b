// The cuda_ipc transport's control segment without a GPU: the header checks and the handshake
// (errors name the segment and the problem), the seqlocked slots that name each version's
// buffer and owner, reads of a lapped slot or of a publisher that detached or died, and a
// restarted publisher that adopts the segment and keeps its newest version.
#include "weight_broadcast/cuda_ipc_control.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "core/process_identity.h"
#include "tests/status_testing.h"
#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/cuda_ipc_transport.h"

namespace prl::weight_broadcast_internal {
namespace {

namespace bip = boost::interprocess;
using ::prl::testing::IsError;
using ReadState = CudaIpcControl::ReadState;

IpcHandle FakeHandle(uint8_t fill) {
  IpcHandle h;
  h.fill(fill);
  return h;
}

class CudaIpcControlTest : public ::testing::Test {
 protected:
  void SetUp() override { RemoveCudaIpcSegment(name_).IgnoreError(); }
  void TearDown() override { RemoveCudaIpcSegment(name_).IgnoreError(); }

  std::unique_ptr<CudaIpcControl> Attach() {
    auto control = CudaIpcControl::Attach(name_, config_);
    EXPECT_TRUE(control.ok()) << control.status();
    return control.ok() ? *std::move(control) : nullptr;
  }
  std::unique_ptr<CudaIpcControl> Open() {
    auto control = CudaIpcControl::Open(name_, config_, absl::ZeroDuration());
    EXPECT_TRUE(control.ok()) << control.status();
    return control.ok() ? *std::move(control) : nullptr;
  }
  void Publish(CudaIpcControl& publisher, int64_t version) {
    const auto w = publisher.BeginWrite(version, handles_);
    publisher.EndWrite(w);
  }
  // Damages the header through a writable mapping of its own.
  template <typename F>
  void Damage(F damage) {
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_write);
    bip::mapped_region region(shm, bip::read_write, 0, kCudaIpcSegmentBytes);
    damage(*static_cast<CudaIpcHeader*>(region.get_address()));
  }

  std::string name_ = absl::StrCat("prl-test-cipc-", getpid());
  ModelConfig config_ = ::prl::testing::ModelOfMiB(1);
  std::array<IpcHandle, 2> handles_ = {FakeHandle(0xa0), FakeHandle(0xb1)};
};

TEST_F(CudaIpcControlTest, SlotsNameTheNewestVersionItsBufferAndOwner) {
  auto publisher = Attach();
  auto reader = Open();
  ASSERT_NE(reader, nullptr);
  CudaIpcControl::SlotView view;
  EXPECT_EQ(reader->BeginRead(&view), ReadState::kNothing);
  EXPECT_EQ(reader->held_version(), -1);
  EXPECT_EQ(reader->weight_bytes(), WeightBytes(config_));

  Publish(*publisher, 4);
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  EXPECT_EQ(view.read.version, 4);
  EXPECT_EQ(view.read.slot, 0);
  EXPECT_EQ(view.handle, handles_[0]);
  EXPECT_EQ(view.owner.publisher, SelfProcessToken());
  ASSERT_TRUE(reader->EnterReader(view.owner));
  EXPECT_TRUE(reader->EndRead(view));
  reader->LeaveReader();

  Publish(*publisher, 5);  // the other slot, the other buffer
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  EXPECT_EQ(view.read.version, 5);
  EXPECT_EQ(view.handle, handles_[1]);
  EXPECT_EQ(reader->held_version(), 5);
  EXPECT_EQ(InspectCudaIpcSegment(name_)->readers, 0);
}

TEST_F(CudaIpcControlTest, ALappedReadIsNotIntact) {
  auto publisher = Attach();
  auto reader = Open();
  Publish(*publisher, 1);
  CudaIpcControl::SlotView view;
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  ASSERT_TRUE(reader->EnterReader(view.owner));
  Publish(*publisher, 2);  // slot 1
  EXPECT_TRUE(reader->EndRead(view)) << "slot 0 was not touched yet";
  Publish(*publisher, 3);  // slot 0 again, under the reader's copy
  EXPECT_FALSE(reader->EndRead(view));
  reader->LeaveReader();
  // A write in progress makes the newest slot busy only while it is the one named: the
  // publisher writes the other one.
  const auto w = publisher->BeginWrite(4, handles_);
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  EXPECT_EQ(view.read.version, 3);
  publisher->EndWrite(w);
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  EXPECT_EQ(view.read.version, 4);
}

TEST_F(CudaIpcControlTest, ADetachedPublishersBuffersAreNeverRead) {
  auto publisher = Attach();
  auto reader = Open();
  Publish(*publisher, 7);
  CudaIpcControl::SlotView view;
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  const CudaIpcControl::Owner first = view.owner;
  ASSERT_TRUE(reader->EnterReader(first));
  // Detach waits for the reader (up to its drain time) ...
  EXPECT_FALSE(publisher->Detach(absl::Milliseconds(50)));
  EXPECT_FALSE(reader->EndRead(view)) << "the owner detached under the copy";
  reader->LeaveReader();
  EXPECT_EQ(InspectCudaIpcSegment(name_)->readers, 0);
  // ... and afterwards nobody enters or reads its slots.
  EXPECT_EQ(reader->attached().publisher, 0u);
  EXPECT_FALSE(reader->EnterReader(first));
  EXPECT_EQ(reader->BeginRead(&view), ReadState::kStale);
  EXPECT_TRUE(publisher->Detach(absl::ZeroDuration())) << "idempotent";

  // A publisher re-created in this very process (same ProcessToken) owns none of the old
  // slots, adopts the newest version's number, and its own versions are readable.
  publisher.reset();
  auto second = Attach();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->held_version(), 7);
  EXPECT_EQ(reader->BeginRead(&view), ReadState::kStale);
  EXPECT_NE(reader->attached(), first);
  Publish(*second, 8);
  ASSERT_EQ(reader->BeginRead(&view), ReadState::kReady);
  EXPECT_EQ(view.read.version, 8);
  EXPECT_NE(view.owner, first);
}

TEST_F(CudaIpcControlTest, ADeadPublishersSlotsAreStaleAndItsSegmentIsAdopted) {
  auto publisher = Attach();
  Publish(*publisher, 3);
  auto reader = Open();
  // Make the attached publisher look like a process that died: a token with another start
  // time than this process's.
  const uint64_t dead = SelfProcessToken() ^ (uint64_t{1} << 40);
  Damage([&](CudaIpcHeader& h) {
    h.publisher.store(dead);
    h.slots[0].publisher.store(dead);
  });
  CudaIpcControl::SlotView view;
  EXPECT_EQ(reader->BeginRead(&view), ReadState::kStale);
  publisher.reset();  // gives up nothing: the role is the dead process's now
  EXPECT_EQ(InspectCudaIpcSegment(name_)->publisher_pid, TokenPid(dead));
  auto info = InspectCudaIpcSegment(name_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->publisher_alive);
  EXPECT_EQ(info->newest_version, 3);
  auto adopted = CudaIpcControl::Attach(name_, config_);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ((*adopted)->held_version(), 3);
  EXPECT_TRUE(InspectCudaIpcSegment(name_)->publisher_alive);
}

TEST_F(CudaIpcControlTest, OneLivePublisherPerSegment) {
  auto publisher = Attach();
  EXPECT_TRUE(IsError(CudaIpcControl::Attach(name_, config_).status(),
                      absl::StatusCode::kAlreadyExists, {name_, "live publisher", "pid"}));
}

TEST_F(CudaIpcControlTest, ModelMismatchNamesTheSegmentAndTheField) {
  auto publisher = Attach();
  ModelConfig other = config_;
  other.num_attention_heads *= 2;
  EXPECT_TRUE(IsError(CudaIpcControl::Open(name_, other, absl::ZeroDuration()).status(),
                      absl::StatusCode::kFailedPrecondition,
                      {"CUDA IPC weight segment '" + name_ + "'", "num_attention_heads is "}));
  publisher.reset();
  EXPECT_TRUE(IsError(CudaIpcControl::Attach(name_, other).status(),
                      absl::StatusCode::kFailedPrecondition, {"num_attention_heads"}));
}

TEST_F(CudaIpcControlTest, DamagedOrForeignSegmentsAreClearErrors) {
  auto publisher = Attach();
  Damage([](CudaIpcHeader& h) { h.fixed.weight_bytes += 4; });
  EXPECT_TRUE(
      IsError(CudaIpcControl::Open(name_, config_, absl::ZeroDuration()).status(),
              absl::StatusCode::kDataLoss,
              {"CUDA IPC weight segment", "corrupted header", "RemoveCudaIpcWeightSegment"}));
  Damage([](CudaIpcHeader& h) { h.fixed.layout_version = 9; });
  EXPECT_TRUE(IsError(CudaIpcControl::Open(name_, config_, absl::ZeroDuration()).status(),
                      absl::StatusCode::kFailedPrecondition, {"layout version 9", "reads 1"}));
  publisher.reset();
  ASSERT_TRUE(RemoveCudaIpcWeightSegment(name_).ok());
  {
    bip::shared_memory_object shm(bip::create_only, name_.c_str(), bip::read_write);
    shm.truncate(kCudaIpcSegmentBytes);  // zeros: no magic
  }
  EXPECT_TRUE(IsError(CudaIpcControl::Open(name_, config_, absl::ZeroDuration()).status(),
                      absl::StatusCode::kDataLoss, {"not a prl CUDA IPC weight segment", "magic"}));
  {
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_write);
    shm.truncate(64);
  }
  EXPECT_TRUE(IsError(CudaIpcControl::Open(name_, config_, absl::ZeroDuration()).status(),
                      absl::StatusCode::kUnavailable, {"smaller than its header"}));
  ASSERT_TRUE(RemoveCudaIpcWeightSegment(name_).ok());
  EXPECT_TRUE(IsError(CudaIpcControl::Open(name_, config_, absl::Milliseconds(100)).status(),
                      absl::StatusCode::kNotFound, {name_}));
  EXPECT_TRUE(IsError(RemoveCudaIpcWeightSegment(name_), absl::StatusCode::kNotFound, {name_}));
  EXPECT_TRUE(IsError(RemoveCudaIpcWeightSegment("a/b"), absl::StatusCode::kInvalidArgument,
                      {"[A-Za-z0-9._-]"}));
}

// What a process without a usable GPU (this build's CUDA runtime, or none) hears.
TEST_F(CudaIpcControlTest, TheTransportWithoutAUsableGpuSaysWhy) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present: weight_cuda_ipc_test covers it";
  auto publisher = CudaIpcWeightPublisher::Create(name_, config_, {});
  ASSERT_FALSE(publisher.ok());
  if (CudaCompiled()) {
    EXPECT_TRUE(IsError(publisher.status(), absl::StatusCode::kFailedPrecondition,
                        {"CudaIpcPublisherOptions.device is cuda:0", "0 usable CUDA GPU"}));
  } else {
    EXPECT_TRUE(IsError(publisher.status(), absl::StatusCode::kUnimplemented,
                        {"built without CUDA", "cuda_ipc"}));
  }
  CudaIpcSubscriberOptions cpu;
  cpu.device = Device::Cpu();
  EXPECT_FALSE(CudaIpcWeightSubscriber::Open(name_, config_, cpu).ok());
  if (CudaCompiled()) {
    EXPECT_TRUE(IsError(CudaIpcWeightSubscriber::Open(name_, config_, cpu).status(),
                        absl::StatusCode::kInvalidArgument,
                        {"CudaIpcSubscriberOptions.device is cpu", "use shm"}));
  }
}

}  // namespace
}  // namespace prl::weight_broadcast_internal
