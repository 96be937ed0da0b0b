// A run of adapters' weight server across nodes (weight_broadcast/grpc_adapter_server.h): one
// server carries every adapter's versions, each subscriber receives only the adapter it names
// (bit for bit, its own settings), a subscriber of an adapter not made yet waits for it, one of
// a deleted adapter stops with NotFound, and an adapter made again (its trainer restarted)
// resumes from its kept version with its subscribers following.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/status_testing.h"
#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/grpc_adapter_server.h"
#include "weight_broadcast/grpc_transport.h"

namespace prl::testing {
namespace {

LoraConfig Adapter(int64_t rank) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 16;
  l.target_modules = {"q_proj", "v_proj"};
  return l;
}

// An adapter's bytes for `version`, distinct per adapter (`salt`).
LoraSet Filled(const ModelConfig& model, const LoraConfig& lora, int64_t version, int64_t salt) {
  LoraSet set = *LoraSet::Allocate(model, lora, Device::Cpu(), false);
  auto* words = static_cast<uint32_t*>(set.buffer.data());
  for (uint64_t i = 0; i < set.buffer.bytes() / 4; ++i) words[i] = PatternWord(version * 97 + salt, i);
  return set;
}

bool Same(const LoraSet& a, const LoraSet& b) {
  return a.buffer.bytes() == b.buffer.bytes() &&
         std::memcmp(a.buffer.data(), b.buffer.data(), a.buffer.bytes()) == 0;
}

class GrpcAdapterServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcPublisherOptions options;
    options.address = "127.0.0.1:0";
    options.chunk_bytes = 4096;  // several chunks per version
    auto started = GrpcAdapterWeightServer::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("grpc-adapter-server-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<GrpcWeightSubscriber> Subscribe(const std::string& adapter_id,
                                                  const LoraConfig& lora) {
    GrpcSubscriberOptions o;
    o.initial_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(200);
    o.adapter_id = adapter_id;
    auto s = GrpcWeightSubscriber::Connect(absl::StrCat("127.0.0.1:", server_->port()),
                                           WeightSpec(model_, lora), o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::string VersionFile(const std::string& adapter_id) const {
    return (dir_ / (adapter_id + ".version")).string();
  }

  ModelConfig model_ = ModelOfMiB(1);
  std::unique_ptr<GrpcAdapterWeightServer> server_;
  std::filesystem::path dir_;
};

TEST_F(GrpcAdapterServerTest, EachSubscriberReceivesOnlyTheAdapterItNames) {
  const LoraConfig math_lora = Adapter(4), code_lora = Adapter(8);
  auto math = server_->Add("ad-000000000001", WeightSpec(model_, math_lora), "");
  auto code = server_->Add("ad-000000000002", WeightSpec(model_, code_lora), "");
  ASSERT_TRUE(math.ok() && code.ok()) << math.status() << code.status();
  const LoraSet math_v1 = Filled(model_, math_lora, 1, 1);
  const LoraSet code_v3 = Filled(model_, code_lora, 3, 2);
  ASSERT_TRUE((*math)->Publish(1, math_v1).ok());
  ASSERT_TRUE((*code)->Publish(3, code_v3).ok());
  auto math_sub = Subscribe("ad-000000000001", math_lora);
  auto code_sub = Subscribe("ad-000000000002", code_lora);
  auto got_math = math_sub->WaitNewer(-1, absl::Seconds(60));
  auto got_code = code_sub->WaitNewer(-1, absl::Seconds(60));
  ASSERT_TRUE(got_math.ok()) << got_math.status();
  ASSERT_TRUE(got_code.ok()) << got_code.status();
  EXPECT_EQ(got_math->version, 1);
  EXPECT_EQ(got_code->version, 3);
  EXPECT_TRUE(Same(*got_math->adapter, math_v1));
  EXPECT_TRUE(Same(*got_code->adapter, code_v3));
  // A subscriber naming one adapter with another's settings is refused naming the setting.
  auto wrong = Subscribe("ad-000000000001", code_lora);
  EXPECT_TRUE(IsError(wrong->WaitNewer(-1, absl::Seconds(60)).status(),
                      absl::StatusCode::kFailedPrecondition, {"lora_r"}));
}

TEST_F(GrpcAdapterServerTest, ASubscriberOfAnAdapterNotMadeYetReceivesItsFirstVersion) {
  const LoraConfig lora = Adapter(4);
  auto early = Subscribe("ad-00000000000a", lora);
  // It retries while the server says the adapter is not served yet.
  while (early->stats().reconnects == 0) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_NE(early->stats().last_error.find("not served here yet"), std::string::npos)
      << early->stats().last_error;
  auto publisher = server_->Add("ad-00000000000a", WeightSpec(model_, lora), "");
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  const LoraSet v0 = Filled(model_, lora, 0, 7);
  ASSERT_TRUE((*publisher)->Publish(0, v0).ok());
  auto got = early->WaitNewer(-1, absl::Seconds(60));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 0);
  EXPECT_TRUE(Same(*got->adapter, v0));
}

TEST_F(GrpcAdapterServerTest, ADeletedAdaptersSubscribersStopWithNotFound) {
  const LoraConfig lora = Adapter(4);
  auto publisher = server_->Add("ad-00000000000b", WeightSpec(model_, lora), "");
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  ASSERT_TRUE((*publisher)->Publish(0, Filled(model_, lora, 0, 3)).ok());
  auto subscriber = Subscribe("ad-00000000000b", lora);
  ASSERT_TRUE(subscriber->WaitNewer(-1, absl::Seconds(60)).ok());
  server_->Remove("ad-00000000000b");
  publisher->reset();
  EXPECT_TRUE(IsError(subscriber->WaitNewer(0, absl::Seconds(60)).status(),
                      absl::StatusCode::kNotFound, {"ad-00000000000b", "deleted"}));
  EXPECT_TRUE(IsError(subscriber->TakeNewer(0).status(), absl::StatusCode::kNotFound, {}));
  auto later = Subscribe("ad-00000000000b", lora);
  EXPECT_TRUE(IsError(later->WaitNewer(-1, absl::Seconds(60)).status(),
                      absl::StatusCode::kNotFound, {"deleted"}));
}

TEST_F(GrpcAdapterServerTest, AnAdapterMadeAgainResumesFromItsKeptVersion) {
  const LoraConfig lora = Adapter(4);
  const std::string id = "ad-00000000000c";
  auto first = server_->Add(id, WeightSpec(model_, lora), VersionFile(id));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Publish(5, Filled(model_, lora, 5, 1)).ok());
  auto subscriber = Subscribe(id, lora);
  auto got = subscriber->WaitNewer(-1, absl::Seconds(60));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 5);
  first->reset();  // its trainer stopped (an error): the channel closes, subscribers wait
  auto again = server_->Add(id, WeightSpec(model_, lora), VersionFile(id));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->newest_version(), 5) << "the kept version, before any subscriber reports";
  EXPECT_FALSE((*again)->Publish(5, Filled(model_, lora, 5, 1)).ok()) << "not newer";
  const LoraSet v6 = Filled(model_, lora, 6, 1);
  ASSERT_TRUE((*again)->Publish(6, v6).ok());
  got = subscriber->WaitNewer(5, absl::Seconds(60));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 6);
  EXPECT_TRUE(Same(*got->adapter, v6));
}

}  // namespace
}  // namespace prl::testing
