// The remote ingest on loopback: a writer on "another node" pushes groups over gRPC and a
// local reader gets them from the shared-memory segment; in a run of adapters, from the
// segment of the adapter the push names.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "replay/ingest_server.h"
#include "rpc/grpc_util.h"
#include "tests/replay/stress_content.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

class IngestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ReplayBuffer::Remove(name_, true).IgnoreError();
    ReplayConfig config;
    config.capacity_bytes = 64 << 20;
    buffer_ = *ReplayBuffer::Create(name_, config);
    IngestOptions options;
    options.address = "127.0.0.1:0";
    options.write_timeout = absl::Milliseconds(200);
    server_ = *ReplayIngestServer::Start(buffer_.get(), options);
    client_ = *ReplayPushClient::Connect(absl::StrCat("127.0.0.1:", server_->port()));
  }
  void TearDown() override {
    server_.reset();
    buffer_.reset();
    ReplayBuffer::Remove(name_, true).IgnoreError();
  }

  std::string name_ = absl::StrCat("prl-test-ingest-", getpid());
  std::unique_ptr<ReplayBuffer> buffer_;
  std::unique_ptr<ReplayIngestServer> server_;
  std::unique_ptr<ReplayPushClient> client_;
};

// Several actors push at once: the server writes from several threads of one process, which
// the segment's lock (named by process) must serialise instead of taking for re-entry.
TEST_F(IngestTest, ConcurrentPushersAreAllWritten) {
  constexpr int kPushers = 6, kPushes = 40;
  std::vector<std::thread> pushers;
  std::atomic<int> failures{0};
  for (int p = 0; p < kPushers; ++p) {
    pushers.emplace_back([&, p] {
      auto client = ReplayPushClient::Connect(absl::StrCat("127.0.0.1:", server_->port()));
      for (int i = 0; i < kPushes && client.ok(); ++i) {
        PushResult result;
        if (!(*client)->Push({StressGroup(2, p * kPushes + i)}, &result).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : pushers) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(buffer_->Stats().groups_in, kPushers * kPushes);
}

TEST_F(IngestTest, ARemoteWriterPushesGroupsThatALocalReaderGets) {
  std::vector<std::vector<RolloutRecord>> groups;
  for (int64_t s = 0; s < 20; ++s) groups.push_back(StressGroup(3, s));
  // One record of ~30 MB: well past gRPC's default 4 MB message limit.
  groups[7][0].completion_tokens.assign(2'000'000, 5);
  groups[7][0].behaviour_logprobs.assign(2'000'000, -0.5f);
  groups[7][0].token_versions.assign(2'000'000, 1);
  PushResult result;
  ASSERT_TRUE(client_->Push(groups, &result).ok());
  EXPECT_EQ(result.groups_accepted, 20u);
  TakeOptions take;
  take.max_groups = 100;
  absl::StatusOr<std::vector<LeasedGroup>> got = buffer_->Take(take);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 20u);
  for (size_t i = 0; i < got->size(); ++i) {
    absl::StatusOr<std::vector<RolloutRecord>> records = (*got)[i].Decode();
    ASSERT_TRUE(records.ok()) << records.status();
    std::sort(records->begin(), records->end(),
              [](const auto& a, const auto& b) { return a.sample_index < b.sample_index; });
    std::vector<RolloutRecord> expected = groups[i];
    std::sort(expected.begin(), expected.end(),
              [](const auto& a, const auto& b) { return a.sample_index < b.sample_index; });
    EXPECT_EQ(*records, expected) << "group " << i;
    ASSERT_TRUE(buffer_->Ack((*got)[i]).ok());
  }
}

TEST_F(IngestTest, InvalidGroupsEndTheStreamWithInvalidArgumentNamingTheRecord) {
  std::vector<std::vector<RolloutRecord>> groups = {StressGroup(3, 0), StressGroup(3, 1)};
  groups[1][0].behaviour_logprobs.pop_back();  // one log-prob short
  PushResult result;
  const absl::Status s = client_->Push(groups, &result);
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, {"push message 1", "records[0]"}))
      << s;
  EXPECT_EQ(result.groups_accepted, 1u) << "the group before the bad one stays accepted";
}

TEST_F(IngestTest, AFullBufferAnswersResourceExhausted) {
  int64_t local = 0;
  while (buffer_->WriteGroup(StressGroup(4, local), absl::ZeroDuration()).ok()) ++local;
  PushResult result;
  const absl::Status s = client_->Push({StressGroup(5, 0)}, &result);
  EXPECT_TRUE(IsError(s, absl::StatusCode::kResourceExhausted, {"is full"})) << s;
  EXPECT_EQ(result.groups_accepted, 0u);
  EXPECT_EQ(buffer_->Stats().groups_in, local);
}

TEST_F(IngestTest, TheServerAnswersGrpcHealthChecks) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  grpc::ByteBuffer request, response;  // HealthCheckRequest{service: ""} is empty
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "HealthCheckResponse{status: SERVING}";
}

// A run of adapters: each push names its adapter, whose buffer it enters; the admit check sees
// the adapter named; a push naming none, or an adapter not made yet, is refused naming why.
TEST(AdapterIngestTest, EachPushEntersTheBufferOfTheAdapterItNames) {
  const std::string base = absl::StrCat("prl-test-ingest-adapters-", getpid());
  const std::vector<std::string> ids = {"ad-000000000001", "ad-000000000002"};
  std::map<std::string, std::shared_ptr<ReplayBuffer>> buffers;
  for (const std::string& id : ids) {
    ReplayBuffer::Remove(base + id, true).IgnoreError();
    ReplayConfig config;
    config.capacity_bytes = 8 << 20;
    buffers[id] = *ReplayBuffer::Create(base + id, config);
  }
  std::vector<std::string> admitted;  // the adapter each admitted push named
  std::mutex mu;
  IngestOptions options;
  options.address = "127.0.0.1:0";
  options.admit = [&](absl::Span<const RolloutRecord>, const std::string& adapter_id) {
    std::lock_guard<std::mutex> lock(mu);
    admitted.push_back(adapter_id);
    return absl::OkStatus();
  };
  options.adapter_buffer =
      [&](const std::string& id) -> absl::StatusOr<std::shared_ptr<ReplayBuffer>> {
    auto it = buffers.find(id);
    if (it == buffers.end()) return absl::UnavailableError(absl::StrCat(id, ": not made yet"));
    return it->second;
  };
  auto server = ReplayIngestServer::Start(nullptr, options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = *ReplayPushClient::Connect(absl::StrCat("127.0.0.1:", (*server)->port()));
  PushResult result;
  ASSERT_TRUE(client->Push({StressGroup(2, 0), StressGroup(2, 1)}, &result, absl::Seconds(60),
                           ids[0]).ok());
  ASSERT_TRUE(client->Push({StressGroup(2, 2)}, &result, absl::Seconds(60), ids[1]).ok());
  EXPECT_EQ(buffers[ids[0]]->Stats().groups_in, 2);
  EXPECT_EQ(buffers[ids[1]]->Stats().groups_in, 1);
  EXPECT_EQ(admitted, (std::vector<std::string>{ids[0], ids[0], ids[1]}));
  EXPECT_TRUE(IsError(client->Push({StressGroup(2, 3)}, &result), absl::StatusCode::kInvalidArgument,
                      {"adapter_id", "found none"}));
  EXPECT_TRUE(IsError(client->Push({StressGroup(2, 4)}, &result, absl::Seconds(60),
                                   "ad-00000000000f"),
                      absl::StatusCode::kUnavailable, {"not made yet"}));
  EXPECT_EQ(buffers[ids[0]]->Stats().groups_in + buffers[ids[1]]->Stats().groups_in, 3);
  server->reset();
  for (const std::string& id : ids) {
    buffers[id].reset();
    ReplayBuffer::Remove(base + id, true).IgnoreError();
  }
}

TEST_F(IngestTest, APushNamingAnAdapterIsRefusedByTheReplayOfOneModel) {
  PushResult result;
  EXPECT_TRUE(IsError(client_->Push({StressGroup(2, 0)}, &result, absl::Seconds(60),
                                    "ad-000000000001"),
                      absl::StatusCode::kInvalidArgument, {"adapter_id: expected none"}));
  EXPECT_EQ(buffer_->Stats().groups_in, 0);
}

}  // namespace
}  // namespace prl::testing
