// rpc::StartServer (rpc/grpc_util.h): gRPC's default SO_REUSEPORT would let a second server
// bind a port in use and split its connections with the first (two runs on one machine
// cross-wired); prl's servers refuse a port in use, naming it.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "collective/kv_store.h"
#include "collective/store_service.h"
#include "core/net_address.h"
#include "rpc/grpc_util.h"

namespace prl::rpc {
namespace {

TEST(ListenTest, ASecondServerOnAPortInUseIsRefusedNamingThePort) {
  collective::MemoryStore memory;
  auto first = collective::StoreServer::Start(&memory, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_TRUE(PortInUse(address));
  auto second = collective::StoreServer::Start(&memory, address);
  ASSERT_FALSE(second.ok()) << "two servers listen on port " << port;
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_NE(second.status().message().find(absl::StrCat("port ", port, " is in use")),
            std::string::npos)
      << second.status();
  first->reset();
  EXPECT_FALSE(PortInUse(address));
  auto again = collective::StoreServer::Start(&memory, address);
  EXPECT_TRUE(again.ok()) << "a freed port is free again: " << again.status();
}

}  // namespace
}  // namespace prl::rpc
