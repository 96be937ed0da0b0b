// Loopback is parsed, never read from a string's prefix (issue 28: "127.evil.example" passed).
#include "core/net_address.h"

#include <gtest/gtest.h>

namespace prl {
namespace {

TEST(NetAddress, LoopbackLiteralsAndLocalhostAreLoopback) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* endpoint :
       {"127.0.0.1:50051", "127.255.0.9:0", "[::1]:443", "localhost:9400", "::1",
        "dns:///localhost:50051", "ipv4:127.0.0.1:1", "ipv6:[::1]:1", "unix:/run/prl.sock"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(endpoint)) << endpoint;
  }
}

TEST(NetAddress, NamesThatLookLikeLoopbackAreNot) {
  for (const char* host : {"127.evil.example", "127.0.0.1.nip.io", "localhost.example.com",
                           "128.0.0.1", "0.0.0.0", "::", "10.0.0.1", "", "::ffff:10.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
  for (const char* endpoint :
       {"127.evil.example:50051", "127.0.0.1.nip.io:80", "[::2]:443", "0.0.0.0:9400",
        "dns:///127.evil.example:1", "::1:80", "verifier.internal:50071", "50051", ""}) {
    EXPECT_FALSE(IsLoopbackEndpoint(endpoint)) << endpoint;
  }
}

}  // namespace
}  // namespace prl
