// The actor's lease book and coordinator link at their edges: a lease is released once however
// many parts of the actor give it up; what a heartbeat asks back reaches the right thread (a
// granted prompt not yet in the engine is handed back at once); and a lease response too large
// to receive never stops the actor — it asks for one prompt at a time instead.
#include "actor/lease_book.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "actor/coordinator_link.h"
#include "prl/v1/prompt.grpc.pb.h"

namespace prl::actor {
namespace {

namespace v1 = prl::v1;

v1::LeaseResponse Granted(std::initializer_list<const char*> ids) {
  v1::LeaseResponse r;
  for (const char* id : ids) r.add_prompts()->set_lease_id(id);
  return r;
}

TEST(LeaseBookTest, ALeaseIsReleasedOnceHoweverOftenItIsGivenUp) {
  LeaseBook book(4);
  book.Grant(Granted({"a"}));
  EXPECT_TRUE(book.Release("a", v1::RELEASE_REASON_ENVIRONMENT_FAILED, absl::InternalError("x")));
  EXPECT_FALSE(book.Release("a", v1::RELEASE_REASON_ENVIRONMENT_FAILED, absl::InternalError("y")));
  EXPECT_EQ(book.TakeReleases().size(), 1u);
  EXPECT_EQ(book.Room(), 4);
}

TEST(LeaseBookTest, WhatTheCoordinatorAsksBackIsHandedToTheEngineLoopOrReleasedAtOnce) {
  LeaseBook book(4);
  book.Grant(Granted({"in-engine", "lost", "waiting"}));
  std::deque<LeasedPrompt> granted = book.TakeGranted();
  granted.pop_front();
  granted.pop_front();
  book.Requeue(std::move(granted));  // "waiting" never reached the engine
  book.GiveBack({"in-engine", "waiting", "unknown"}, {"lost"});
  const LeaseBook::GivenBack given = book.TakeGivenBack();
  EXPECT_EQ(given.reclaimed, std::vector<std::string>{"in-engine"});
  EXPECT_EQ(given.lost, std::vector<std::string>{"lost"});
  const std::deque<v1::ReleaseRequest> released = book.TakeReleases();
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].lease_id(), "waiting");
  EXPECT_EQ(released[0].reason(), v1::RELEASE_REASON_RECLAIMED);
  EXPECT_TRUE(book.TakeGranted().empty());
}

// A coordinator whose lease responses are larger than an actor receives (64 MiB), unless it is
// asked for one prompt.
class HugeLeases final : public v1::ActorControl::Service {
 public:
  grpc::Status LeasePrompts(grpc::ServerContext*, const v1::LeaseRequest* request,
                            v1::LeaseResponse* response) override {
    asked_.push_back(request->max_prompts());
    if (request->max_prompts() > 1) {
      v1::LeasedPrompt* p = response->add_prompts();
      p->set_lease_id("huge");
      p->set_reference(std::string(size_t{70} << 20, 'x'));  // 70 MiB
      return grpc::Status::OK;
    }
    response->add_prompts()->set_lease_id("small");
    return grpc::Status::OK;
  }
  std::vector<int32_t> asked_;
};

TEST(CoordinatorLinkTest, ALeaseResponseTooLargeToReceiveDoesNotStopTheActor) {
  HugeLeases service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ActorStatsBoard stats;
  CoordinatorLink link(absl::StrCat("127.0.0.1:", port), "a", {}, &stats);
  LeaseBook book(8);
  EXPECT_TRUE(link.LeaseMore(book).ok()) << "not an error that stops the actor";
  EXPECT_TRUE(book.TakeGranted().empty());
  ASSERT_TRUE(link.LeaseMore(book).ok());
  const std::deque<LeasedPrompt> granted = book.TakeGranted();
  ASSERT_EQ(granted.size(), 1u);
  EXPECT_EQ(granted[0].lease.lease_id(), "small");
  EXPECT_EQ(service.asked_, (std::vector<int32_t>{8, 1}));
}

}  // namespace
}  // namespace prl::actor
