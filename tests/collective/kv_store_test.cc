// The rendezvous stores: Get waits for a later Set and times out naming the key, in memory,
// in a directory and over gRPC; a gRPC client started before its server still gets through;
// file values are never seen half-written; rank 0's server is shared and stops with its last
// user; the Gloo adapter throws and keeps the status.
#include "collective/kv_store.h"

#include <gloo/common/error.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collective/gloo_store.h"
#include "collective/store_service.h"
#include "tests/free_port.h"
#include "tests/status_testing.h"

namespace prl::collective {
namespace {

using ::prl::testing::FreePort;

using ::prl::testing::IsError;

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/prl_kv_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// Every store: a Get that starts first gets the value of a later Set.
void ExpectGetWaitsForSet(KvStore& store) {
  std::string got;
  std::thread reader([&] {
    absl::StatusOr<std::string> value = store.Get("group/late key", absl::Seconds(30));
    ASSERT_TRUE(value.ok()) << value.status();
    got = *value;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string value("bytes\0with nul", 14);
  ASSERT_TRUE(store.Set("group/late key", value).ok());
  reader.join();
  EXPECT_EQ(got, value);
  ASSERT_TRUE(store.Set("group/late key", "replaced").ok());
  EXPECT_EQ(*store.Get("group/late key", absl::ZeroDuration()), "replaced");
  ASSERT_TRUE(store.Delete("group/late key").ok());
  ASSERT_TRUE(store.Delete("group/never set").ok()) << "deleting an absent key is fine";
  EXPECT_TRUE(IsError(store.Get("group/late key", absl::Milliseconds(10)).status(),
                      absl::StatusCode::kDeadlineExceeded, {"'group/late key'"}));
}

void ExpectGetTimesOutNamingTheKey(KvStore& store) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = store.Get("default/gloo/7", absl::Milliseconds(300)).status();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(IsError(s, absl::StatusCode::kDeadlineExceeded,
                      {"kv store get 'default/gloo/7'", "no value after 0.3 s"}));
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(MemoryStoreTest, GetWaitsForALaterSetAndTimesOutNamingTheKey) {
  MemoryStore store;
  ExpectGetWaitsForSet(store);
  ExpectGetTimesOutNamingTheKey(store);
  EXPECT_TRUE(IsError(store.Set("", "x"), absl::StatusCode::kInvalidArgument, {"key"}));
}

TEST(MemoryStoreTest, ListsTheKeysUnderAPrefixInOrder) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("members/b", "2").ok());
  ASSERT_TRUE(store.Set("members/a", "1").ok());
  ASSERT_TRUE(store.Set("membersX", "no").ok());
  ASSERT_TRUE(store.Set("epoch", "no").ok());
  using KV = std::pair<std::string, std::string>;
  EXPECT_EQ(store.List("members/"), (std::vector<KV>{{"members/a", "1"}, {"members/b", "2"}}));
  ASSERT_TRUE(store.Delete("members/a").ok());
  EXPECT_EQ(store.List("members/"), (std::vector<KV>{{"members/b", "2"}}));
  EXPECT_TRUE(store.List("nothing/").empty());
  EXPECT_EQ(store.List("").size(), 3u);
}

TEST(FileStoreTest, GetWaitsForALaterSetAndTimesOutNamingTheKey) {
  const std::string dir = TempDir("file");
  auto store = FileStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectGetWaitsForSet(**store);
  ExpectGetTimesOutNamingTheKey(**store);
  EXPECT_EQ((*store)->PathOf("a/b c"), dir + "/a%2Fb%20c") << "keys stay inside the directory";
  std::filesystem::remove_all(dir);
}

TEST(FileStoreTest, ReadersNeverSeeAHalfWrittenValue) {
  const std::string dir = TempDir("atomic");
  auto store = *FileStore::Open(dir);
  const size_t size = 1 << 20;
  ASSERT_TRUE(store->Set("v", std::string(size, 'a')).ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(store->Set("v", std::string(size, i % 2 ? 'b' : 'a')).ok());
    }
    done = true;
  });
  int reads = 0;
  while (!done || reads < 10) {
    absl::StatusOr<std::string> value = store->Get("v", absl::Seconds(5));
    ASSERT_TRUE(value.ok()) << value.status();
    ASSERT_EQ(value->size(), size);
    ASSERT_EQ(value->find_first_not_of((*value)[0]), std::string::npos) << "a torn value";
    ++reads;
  }
  writer.join();
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST(FileStoreTest, AnUncreatableDirectoryIsAnErrorNamingIt) {
  EXPECT_TRUE(IsError(FileStore::Open("/proc/prl_no_such/dir").status(),
                      absl::StatusCode::kFailedPrecondition, {"/proc/prl_no_such/dir"}));
}

TEST(GrpcStoreTest, GetWaitsForALaterSetAndTimesOutNamingTheKey) {
  MemoryStore memory;
  auto server = StoreServer::Start(&memory, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  GrpcStore client(absl::StrCat("127.0.0.1:", (*server)->port()), absl::Seconds(30));
  ExpectGetWaitsForSet(client);
  ExpectGetTimesOutNamingTheKey(client);
  // Both sides see the same map.
  ASSERT_TRUE(memory.Set("from rank 0", "hello").ok());
  EXPECT_EQ(*client.Get("from rank 0", absl::Seconds(5)), "hello");
  const std::string big(3 << 20, 'z');
  ASSERT_TRUE(client.Set("big", big).ok());
  EXPECT_EQ(*memory.Get("big", absl::ZeroDuration()), big);
}

TEST(GrpcStoreTest, AClientThatStartsBeforeTheServerGetsThrough) {
  const int port = FreePort();
  GrpcStore client(absl::StrCat("127.0.0.1:", port), absl::Seconds(30));
  absl::StatusOr<std::string> got;
  std::thread reader([&] { got = client.Get("default/gloo/0", absl::Seconds(30)); });
  std::thread setter([&] { EXPECT_TRUE(client.Set("default/gloo/1", "one").ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rank 0 is late
  MemoryStore memory;
  auto server = StoreServer::Start(&memory, absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(memory.Set("default/gloo/0", "zero").ok());
  reader.join();
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "zero");
  EXPECT_EQ(*memory.Get("default/gloo/1", absl::Seconds(5)), "one");
}

TEST(GrpcStoreTest, NoServerIsDeadlineExceededNamingTheKeyAndTheServer) {
  const int port = FreePort();
  GrpcStore client(absl::StrCat("127.0.0.1:", port), absl::Milliseconds(300));
  const std::string server = absl::StrCat("127.0.0.1:", port);
  EXPECT_TRUE(IsError(client.Get("default/nccl/unique_id", absl::Milliseconds(300)).status(),
                      absl::StatusCode::kDeadlineExceeded,
                      {"'default/nccl/unique_id'", "no value after 1.3 s", server}));
  EXPECT_TRUE(IsError(client.Set("default/gloo/rank_1", "x"), absl::StatusCode::kDeadlineExceeded,
                      {"set 'default/gloo/rank_1'", server, "is rank 0 running"}));
}

TEST(RendezvousStoreTest, RankZeroServesOneStorePerPortUntilItsLastUserGoes) {
  RendezvousConfig config;
  config.master_port = FreePort();
  config.timeout = absl::Milliseconds(500);
  auto first = OpenRendezvousStore(config);
  auto second = OpenRendezvousStore(config);
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  EXPECT_EQ(first->get(), second->get());
  config.rank = 1;
  config.world_size = 2;
  auto client = OpenRendezvousStore(config);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*first)->Set("k", "v").ok());
  EXPECT_EQ(*(*client)->Get("k", absl::Seconds(5)), "v");
  first->reset();
  EXPECT_EQ(*(*client)->Get("k", absl::Seconds(5)), "v") << "still served for `second`";
  second->reset();
  EXPECT_TRUE(IsError((*client)->Set("k", "w"), absl::StatusCode::kDeadlineExceeded, {"'k'"}))
      << "the server stopped with its last user";
}

TEST(RendezvousStoreTest, AnInvalidConfigIsRejected) {
  RendezvousConfig config;
  config.rank = 2;
  config.world_size = 2;
  EXPECT_TRUE(IsError(OpenRendezvousStore(config).status(), absl::StatusCode::kInvalidArgument,
                      {"RANK=2"}));
}

TEST(GlooStoreTest, PrefixesKeysThrowsOnTimeOutAndKeepsTheStatus) {
  auto memory = std::make_shared<MemoryStore>();
  GlooStore store(memory, "grp/gloo/", absl::Milliseconds(200));
  store.set("0", {'a', 'b'});
  EXPECT_EQ(*memory->Get("grp/gloo/0", absl::ZeroDuration()), "ab");
  EXPECT_EQ(store.get("0"), (std::vector<char>{'a', 'b'}));
  store.wait({"0"});
  EXPECT_TRUE(store.error().ok());
  EXPECT_THROW(store.wait({"0", "1"}, std::chrono::milliseconds(100)), gloo::IoException);
  EXPECT_TRUE(IsError(store.error(), absl::StatusCode::kDeadlineExceeded, {"'grp/gloo/1'"}));
  EXPECT_THROW(store.get("2"), gloo::IoException);
  EXPECT_TRUE(IsError(store.error(), absl::StatusCode::kDeadlineExceeded, {"'grp/gloo/1'"}))
      << "the first error is kept";
  EXPECT_EQ(store.keys_set(), std::vector<std::string>{"grp/gloo/0"});
}

}  // namespace
}  // namespace prl::collective
