// Adapter-only versions (weight_transport.h's WeightSpec with a LoRA adapter: what a LoRA
// learner publishes) on every CPU transport — shm, grpc and the collective one over Gloo: each
// version arrives bit for bit as a LoraSet (VersionedWeights::adapter, no ParameterSet), one
// version moves the adapter's bytes only (a small fraction of the model's), a subscriber of
// other adapter settings, or of the full model, is refused naming the first differing field,
// and settings the model cannot take are refused when either end is made.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "tests/status_testing.h"
#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/collective_transport.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::testing {
namespace {

LoraConfig Adapter(int64_t rank) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 16;
  l.target_modules = {"q_proj", "v_proj", "down_proj"};
  return l;
}

void Fill(const LoraSet& set, int64_t version) {
  auto* words = static_cast<uint32_t*>(set.buffer.data());
  for (uint64_t i = 0; i < set.buffer.bytes() / 4; ++i) words[i] = PatternWord(version, i);
}

std::string Check(const LoraSet& set, int64_t version) {
  const auto* words = static_cast<const uint32_t*>(set.buffer.data());
  for (uint64_t i = 0; i < set.buffer.bytes() / 4; ++i) {
    if (words[i] != PatternWord(version, i)) return absl::StrCat("word ", i, " differs");
  }
  return "";
}

// One transport's two ends, made for a spec.
struct Transport {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<WeightPublisher>>(const WeightSpec&)> publish;
  std::function<absl::StatusOr<std::unique_ptr<WeightSubscriber>>(const WeightSpec&)> subscribe;
};

class AdapterTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  Transport Make() {
    const std::string kind = GetParam();
    if (kind == "shm") {
      const std::string segment = absl::StrCat("prl-test-adapter-", getpid());
      RemoveShmWeightSegment(segment).IgnoreError();
      cleanup_ = [segment] { RemoveShmWeightSegment(segment).IgnoreError(); };
      return {
          kind,
          [segment](const WeightSpec& spec) -> absl::StatusOr<std::unique_ptr<WeightPublisher>> {
            PRL_ASSIGN_OR_RETURN(auto p, ShmWeightPublisher::Create(segment, spec));
            return std::unique_ptr<WeightPublisher>(std::move(p));
          },
          [segment](const WeightSpec& spec) -> absl::StatusOr<std::unique_ptr<WeightSubscriber>> {
            PRL_ASSIGN_OR_RETURN(auto s, ShmWeightSubscriber::Open(segment, spec));
            return std::unique_ptr<WeightSubscriber>(std::move(s));
          }};
    }
    if (kind == "grpc") {
      return {kind,
              [this](const WeightSpec& spec) -> absl::StatusOr<std::unique_ptr<WeightPublisher>> {
                GrpcPublisherOptions o;
                o.address = "127.0.0.1:0";
                o.chunk_bytes = 4096;  // several chunks per version
                PRL_ASSIGN_OR_RETURN(auto p, GrpcWeightPublisher::Start(spec, o));
                port_ = p->port();
                return std::unique_ptr<WeightPublisher>(std::move(p));
              },
              [this](const WeightSpec& spec) -> absl::StatusOr<std::unique_ptr<WeightSubscriber>> {
                GrpcSubscriberOptions o;
                o.initial_backoff = absl::Milliseconds(20);
                o.max_backoff = absl::Milliseconds(200);
                PRL_ASSIGN_OR_RETURN(auto s, GrpcWeightSubscriber::Connect(
                                                 absl::StrCat("127.0.0.1:", port_), spec, o));
                return std::unique_ptr<WeightSubscriber>(std::move(s));
              }};
    }
    return {kind,
            [this](const WeightSpec& spec) -> absl::StatusOr<std::unique_ptr<WeightPublisher>> {
              CollectivePublisherOptions o;
              o.timeout = absl::Seconds(10);
              o.keepalive_interval = absl::Milliseconds(500);
              o.member_timeout = absl::Seconds(3);
              PRL_ASSIGN_OR_RETURN(auto p, CollectiveWeightPublisher::Start(spec, o));
              port_ = p->port();
              return std::unique_ptr<WeightPublisher>(std::move(p));
            },
            [this](const WeightSpec& spec) -> absl::StatusOr<std::unique_ptr<WeightSubscriber>> {
              CollectiveSubscriberOptions o;
              o.timeout = absl::Seconds(10);
              o.heartbeat_interval = absl::Milliseconds(100);
              PRL_ASSIGN_OR_RETURN(auto s, CollectiveWeightSubscriber::Connect(
                                               absl::StrCat("127.0.0.1:", port_), spec, o));
              return std::unique_ptr<WeightSubscriber>(std::move(s));
            }};
  }
  void TearDown() override {
    if (cleanup_) cleanup_();
  }

  ModelConfig model_ = ModelOfMiB(2);
  int port_ = 0;
  std::function<void()> cleanup_;
};

TEST_P(AdapterTransportTest, AdapterVersionsArriveBitForBitAndMoveOnlyTheAdaptersBytes) {
  Transport t = Make();
  const WeightSpec spec(model_, Adapter(4));
  auto publisher = t.publish(spec);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  auto subscriber = t.subscribe(spec);
  ASSERT_TRUE(subscriber.ok()) << subscriber.status();
  LoraSet adapter = *LoraSet::Allocate(model_, *spec.adapter, Device::Cpu(), false);
  const int64_t adapter_bytes = static_cast<int64_t>(adapter.buffer.bytes());
  EXPECT_EQ(WeightBytes(spec), adapter_bytes);
  EXPECT_LT(adapter_bytes * 20, WeightBytes(WeightSpec(model_))) << "an adapter is small";
  int64_t have = -1;
  for (int64_t version : {3, 4, 9}) {
    Fill(adapter, version);
    ASSERT_TRUE((*publisher)->Publish(version, adapter).ok());
    auto got = (*subscriber)->WaitNewer(have, absl::Seconds(60));
    while (got.ok() && got->version < version) {
      got = (*subscriber)->WaitNewer(got->version, absl::Seconds(60));
    }
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->version, version);
    ASSERT_NE(got->adapter, nullptr);
    EXPECT_EQ(got->weights, nullptr);
    EXPECT_EQ(Check(*got->adapter, version), "");
    have = version;
  }
  EXPECT_EQ((*publisher)->stats().version_bytes, adapter_bytes);
  const SubscriberStats s = (*subscriber)->stats();
  EXPECT_EQ(s.bytes_received, s.versions_received * adapter_bytes);
}

TEST_P(AdapterTransportTest, ASubscriberOfOtherAdapterSettingsOrOfTheModelIsRefused) {
  Transport t = Make();
  auto publisher = t.publish(WeightSpec(model_, Adapter(4)));
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  LoraSet adapter = *LoraSet::Allocate(model_, Adapter(4), Device::Cpu(), false);
  Fill(adapter, 1);
  ASSERT_TRUE((*publisher)->Publish(1, adapter).ok());
  // A LoraSet of other settings is not this publisher's either.
  LoraSet other = *LoraSet::Allocate(model_, Adapter(8), Device::Cpu(), true);
  EXPECT_TRUE(IsError((*publisher)->Publish(2, other), absl::StatusCode::kFailedPrecondition,
                      {"LoRA adapter mismatch: lora_r is 4", "but 8"}));
  for (const WeightSpec& wrong : {WeightSpec(model_, Adapter(8)), WeightSpec(model_)}) {
    auto subscriber = t.subscribe(wrong);
    absl::Status refused = subscriber.status();
    if (subscriber.ok()) {  // grpc refuses on the stream: the first WaitNewer says it
      refused = (*subscriber)->WaitNewer(-1, absl::Seconds(60)).status();
    }
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << t.name << ": " << refused;
    EXPECT_NE(refused.message().find("lora_r"), std::string::npos) << refused;
    EXPECT_NE(refused.message().find("learner.lora_"), std::string::npos) << refused;
  }
}

TEST_P(AdapterTransportTest, AnAdapterSpecTheModelCannotTakeIsRefusedNamingTheSetting) {
  Transport t = Make();
  LoraConfig bad = Adapter(4);
  bad.target_modules = {"q_proj", "lm_head"};
  const absl::Status publisher = t.publish(WeightSpec(model_, bad)).status();
  EXPECT_EQ(publisher.code(), absl::StatusCode::kInvalidArgument) << publisher;
  EXPECT_NE(publisher.message().find("lm_head"), std::string::npos) << publisher;
  bad = Adapter(0);
  const absl::Status subscriber = t.subscribe(WeightSpec(model_, bad)).status();
  EXPECT_EQ(subscriber.code(), absl::StatusCode::kInvalidArgument) << subscriber;
  EXPECT_NE(subscriber.message().find("rank"), std::string::npos) << subscriber;
}

INSTANTIATE_TEST_SUITE_P(CpuTransports, AdapterTransportTest,
                         ::testing::Values("shm", "grpc", "nccl_over_gloo"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace prl::testing
