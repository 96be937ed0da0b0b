// A run of adapters through the coordinator (coordinator/adapters.h, coordinator/tenancy.cc):
// a set names its adapter (made by the first set, named again by later ones, other settings
// refused naming the field), each adapter has its own lag budget and learner version, deleting
// one cancels its sets and frees its budget, a group enters only its lease's adapter's replay,
// and all of it survives a restart and a compaction.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/group_id.h"
#include "tests/coordinator/coordinator_fixture.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

using ::prl::testing::IsError;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

class AdaptersTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    config_.adapters = true;
    config_.adapter_defaults.set_rank(8);
    config_.adapter_defaults.set_alpha(16);
    config_.adapter_defaults.add_target_modules("q_proj");
    config_.adapter_defaults.add_target_modules("v_proj");
    config_.adapter_defaults.set_learning_rate(1e-4);
  }
  static v1::SubmitPromptSetRequest For(const std::string& adapter, int prompts, int rank = 0) {
    v1::SubmitPromptSetRequest r = Request(prompts);
    r.mutable_adapter()->set_name(adapter);
    r.mutable_adapter()->set_rank(rank);
    return r;
  }
  static std::string IdOf(Coordinator& c, const std::string& name) {
    const v1::ListAdaptersResponse list = c.ListAdapters();
    for (const v1::AdapterStatus& a : list.adapters()) {
      if (a.spec().name() == name) return a.adapter_id();
    }
    return "";
  }
  // Leases up to n prompts; the adapter names of those leased.
  static std::vector<std::string> LeaseAdapters(Coordinator& c, const std::string& actor, int n) {
    std::vector<std::string> out;
    absl::StatusOr<v1::LeaseResponse> r = c.Lease(LeaseOf(actor, n));
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      for (const v1::LeasedPrompt& p : r->prompts()) out.push_back(p.adapter().spec().name());
    }
    return out;
  }
};

TEST_F(AdaptersTest, TheFirstSetMakesTheAdapterWithDefaultsAndLaterSetsNameIt) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("math", 1, /*rank=*/4)).ok());
  const v1::ListAdaptersResponse list = c->ListAdapters();
  ASSERT_EQ(list.adapters_size(), 1);
  const v1::AdapterStatus& a = list.adapters(0);
  EXPECT_EQ(a.spec().name(), "math");
  EXPECT_EQ(a.spec().rank(), 4);          // given
  EXPECT_EQ(a.spec().alpha(), 16);        // the run's default
  EXPECT_EQ(a.spec().target_modules_size(), 2);
  EXPECT_DOUBLE_EQ(a.spec().learning_rate(), 1e-4);
  EXPECT_EQ(a.adapter_id().substr(0, 3), "ad-");
  // Named alone, or with the same settings: the same adapter.
  ASSERT_TRUE(c->Submit(For("math", 1)).ok());
  ASSERT_TRUE(c->Submit(For("math", 1, 4)).ok());
  EXPECT_EQ(c->ListAdapters().adapters_size(), 1);
  EXPECT_EQ(c->ListAdapters().adapters(0).prompt_sets_running(), 3);
  // Other settings: refused, naming the field and both values; nothing is submitted.
  absl::StatusOr<v1::SubmitPromptSetResponse> other = c->Submit(For("math", 1, 16));
  EXPECT_TRUE(IsError(other.status(), kInvalid, {"adapter.rank"}));
  EXPECT_TRUE(IsError(other.status(), kInvalid, {"exists with rank 4, found 16"}));
  EXPECT_EQ(c->List().size(), 3u);
  // A lease carries the adapter: its id and settings, and the set's status names it.
  const std::string actor = c->RegisterActor("a")->actor_id();
  absl::StatusOr<v1::LeaseResponse> lease = c->Lease(LeaseOf(actor, 1));
  ASSERT_TRUE(lease.ok() && lease->prompts_size() == 1);
  EXPECT_EQ(lease->prompts(0).adapter().adapter_id(), a.adapter_id());
  EXPECT_EQ(lease->prompts(0).adapter().spec().rank(), 4);
  EXPECT_EQ(c->Get(lease->prompts(0).prompt_set_id())->adapter(), "math");
}

TEST_F(AdaptersTest, BadAdapterSettingsAreRefusedNamingTheField) {
  auto c = Open();
  const auto refused = [&](v1::SubmitPromptSetRequest r, const std::string& field) {
    EXPECT_TRUE(IsError(c->Submit(r).status(), kInvalid, {field})) << field;
  };
  refused(For("Math Team", 1), "adapter.name");
  refused(For("-x", 1), "adapter.name");
  refused(For(std::string(65, 'a'), 1), "adapter.name");
  refused(For("x", 1, 4096), "adapter.rank");
  refused(For("x", 1, -1), "adapter.rank");
  v1::SubmitPromptSetRequest r = For("x", 1);
  r.mutable_adapter()->set_alpha(-2);
  refused(r, "adapter.alpha");
  r = For("x", 1);
  r.mutable_adapter()->add_target_modules("lm_head");
  refused(r, "adapter.target_modules[0]");
  r = For("x", 1);
  r.mutable_adapter()->set_learning_rate(2);
  refused(r, "adapter.learning_rate");
  // A run of adapters trains adapters only.
  refused(Request(1), "adapter.name");
  EXPECT_TRUE(c->ListAdapters().adapters().empty());
  EXPECT_TRUE(c->List().empty());
  c.reset();
  // The model's own check (its targets, the rank against every target) runs too.
  config_.validate_adapter = [](const v1::AdapterSpec& s) {
    return s.rank() > 6 ? absl::InvalidArgumentError("rank 8 exceeds hidden_size 6")
                        : absl::OkStatus();
  };
  auto d = Open();
  EXPECT_TRUE(IsError(d->Submit(For("x", 1, 8)).status(), kInvalid, {"exceeds hidden_size"}));
  EXPECT_TRUE(d->List().empty());
}

TEST_F(AdaptersTest, ARunOfOneModelRefusesAnAdapter) {
  config_.adapters = false;
  auto c = Open();
  EXPECT_TRUE(IsError(c->Submit(For("math", 1)).status(), kInvalid, {"coordinator.adapters"}));
  EXPECT_TRUE(c->Submit(Request(1)).ok());
}

// Each adapter's prompts in flight plus its groups not yet trained on stay within its own
// budget: one adapter's full budget never holds back another's, and the learner's report of
// one adapter frees that adapter's budget alone.
TEST_F(AdaptersTest, EachAdapterHasItsOwnLagBudget) {
  config_.max_lag = 0;
  config_.groups_per_step = 2;
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("math", 6)).ok());
  ASSERT_TRUE(c->Submit(For("code", 6)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  std::vector<std::string> leased = LeaseAdapters(*c, actor, 8);
  EXPECT_EQ(std::count(leased.begin(), leased.end(), "math"), 2);
  EXPECT_EQ(std::count(leased.begin(), leased.end(), "code"), 2);
  EXPECT_TRUE(LeaseAdapters(*c, actor, 8).empty());  // both budgets full
  // The learner trained math's two groups (version 1 of math): math may lease two more.
  v1::LearnerProgressRequest progress;
  v1::AdapterProgress* math = progress.add_adapters();
  math->set_adapter_id(IdOf(*c, "math"));
  math->set_version(1);
  math->set_groups_consumed(2);
  absl::StatusOr<v1::LearnerProgressResponse> reply = c->LearnerProgress(progress);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->adapter_completions_size(), 2);  // every live adapter's completions
  // Still leased (not completed): the budget counts them in flight.
  EXPECT_TRUE(LeaseAdapters(*c, actor, 8).empty());
  const CoordinatorStats stats = c->Stats();
  EXPECT_EQ(stats.adapters.at("math").prompts_in_flight, 2);
  EXPECT_EQ(stats.adapters.at("math").version, 1);
  EXPECT_EQ(stats.adapters.at("code").version, 0);
  EXPECT_EQ(c->ListAdapters().adapters(0).version(), 1);
}

TEST_F(AdaptersTest, AGroupEntersOnlyTheReplayOfItsLeasesAdapter) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("math", 1)).ok());
  ASSERT_TRUE(c->Submit(For("code", 1)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  absl::StatusOr<v1::LeaseResponse> leased = c->Lease(LeaseOf(actor, 2));
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->prompts_size(), 2);
  for (const v1::LeasedPrompt& p : leased->prompts()) {
    const std::string own = IdOf(*c, p.adapter().spec().name());
    const std::string other = IdOf(*c, p.adapter().spec().name() == "math" ? "code" : "math");
    ASSERT_EQ(p.adapter().adapter_id(), own);
    v1::CheckGroupRequest check;
    check.set_prompt_set_id(p.prompt_set_id());
    check.set_prompt_index(p.prompt_index());
    check.set_group_id(GroupIdOfLease(p.lease_id()));
    check.set_adapter_id(own);
    EXPECT_TRUE(c->CheckGroup(check).ok());
    check.set_adapter_id(other);  // an actor writing into another tenant's adapter
    EXPECT_TRUE(IsError(c->CheckGroup(check), absl::StatusCode::kPermissionDenied, {"adapter_id"}));
    check.clear_adapter_id();  // the run's own replay: none in a run of adapters
    EXPECT_TRUE(IsError(c->CheckGroup(check), absl::StatusCode::kPermissionDenied, {"adapter_id"}));
  }
  EXPECT_EQ(c->Stats().rejected_groups, 4);
}

// Fairness under a flood (docs/tenants.md, "Fairness"): one adapter's ten sets of ten times the
// others' prompts take no more than a third of the actor's leases with two other adapters
// waiting; each other adapter gets at least 0.8 of its fair share of completed samples, and the
// tenants' metrics (CoordinatorStats::tenants) count each one's samples and prompts in flight.
TEST_F(AdaptersTest, AFloodingAdapterLeavesEveryOtherItsFairShare) {
  config_.groups_per_step = 0;  // no lag budget: only the lease order decides
  auto c = Open();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(c->Submit(For("flood", 1000)).ok());
  ASSERT_TRUE(c->Submit(For("math", 1000)).ok());
  ASSERT_TRUE(c->Submit(For("code", 1000)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  std::map<std::string, int> samples;  // completed, by adapter
  int total = 0;
  for (int round = 0; round < 200; ++round) {  // an actor of 6 slots, each lease completed
    absl::StatusOr<v1::LeaseResponse> leased = c->Lease(LeaseOf(actor, 6));
    ASSERT_TRUE(leased.ok()) << leased.status();
    ASSERT_EQ(leased->prompts_size(), 6);
    for (const v1::LeasedPrompt& p : leased->prompts()) {
      ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
      samples[p.adapter().spec().name()] += p.samples();
      total += p.samples();
    }
  }
  const double fair = total / 3.0;
  for (const std::string name : {"math", "code"}) {
    EXPECT_GE(samples[name], 0.8 * fair) << name << ": " << samples[name] << " of " << total;
  }
  EXPECT_LE(samples["flood"], 1.2 * fair) << samples["flood"] << " of " << total;
  const CoordinatorStats stats = c->Stats();
  ASSERT_EQ(stats.tenants.size(), 1u) << "no tenant tokens: every set is the operator's";
  EXPECT_EQ(stats.tenants.at("_operator").samples_completed, total);
  EXPECT_EQ(stats.tenants.at("_operator").groups_completed, 1200);
  EXPECT_EQ(stats.tenants.at("_operator").prompts_in_flight, 0);
}

TEST_F(AdaptersTest, AGroupCompletedCountsAgainstItsAdapterUntilTheLearnerTrainsIt) {
  config_.max_lag = 0;
  config_.groups_per_step = 1;
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("math", 4)).ok());
  ASSERT_TRUE(c->Submit(For("code", 4)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  absl::StatusOr<v1::LeaseResponse> first = c->Lease(LeaseOf(actor, 4));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->prompts_size(), 2);  // one per adapter
  for (const v1::LeasedPrompt& p : first->prompts()) {
    ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
  }
  EXPECT_TRUE(LeaseAdapters(*c, actor, 4).empty());  // completed, not trained: budgets full
  EXPECT_EQ(c->Stats().adapters.at("code").groups_unconsumed, 1);
  // The learner reports code trained (backlog 0), echoing nothing (its first report).
  v1::LearnerProgressRequest progress;
  v1::AdapterProgress* code = progress.add_adapters();
  code->set_adapter_id(IdOf(*c, "code"));
  code->set_version(1);
  code->set_groups_consumed(1);
  absl::StatusOr<v1::LearnerProgressResponse> reply = c->LearnerProgress(progress);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(LeaseAdapters(*c, actor, 4), std::vector<std::string>{"code"});
  // Its next report echoes the reply: the completion after it counts against code until a
  // report says it was trained.
  progress.mutable_seen()->CopyFrom(*reply);
  EXPECT_EQ(c->Stats().adapters.at("code").prompts_in_flight, 1);
  ASSERT_TRUE(c->LearnerProgress(progress).ok());
  EXPECT_EQ(c->Stats().adapters.at("code").groups_unconsumed, 0);
  EXPECT_EQ(c->Stats().adapters.at("math").groups_unconsumed, 1);
}

// An adapter's evaluation set (prl run's per-tenant evaluation) runs on the adapter and opens
// its rounds at the adapter's versions: neither another adapter's progress nor the learner's
// own version makes a round due.
TEST_F(AdaptersTest, AnAdaptersEvaluationSetFollowsItsAdaptersVersion) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("code", 1)).ok());
  v1::SubmitPromptSetRequest eval = For("math", 2);
  eval.mutable_eval()->set_every_versions(2);
  absl::StatusOr<v1::SubmitPromptSetResponse> submitted = c->Submit(eval);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string set = submitted->prompt_set_id();
  v1::ActorCapacity slots;
  slots.set_max_prompts_in_flight(8);
  const std::string actor = c->RegisterActor("a", slots)->actor_id();
  absl::StatusOr<v1::LeaseResponse> lease = c->Lease(LeaseOf(actor, 8));
  ASSERT_TRUE(lease.ok());
  int evals = 0;
  for (const v1::LeasedPrompt& p : lease->prompts()) {
    if (!p.eval()) continue;
    ++evals;
    EXPECT_EQ(p.adapter().spec().name(), "math") << "evaluated on its adapter";
    EXPECT_EQ(p.adapter().adapter_id(), IdOf(*c, "math"));
    ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
  }
  ASSERT_EQ(evals, 2);
  ASSERT_EQ(c->Get(set)->eval_rounds_size(), 1);
  EXPECT_EQ(c->Get(set)->eval_rounds(0).version(), 0);
  const auto report = [&](const std::string& adapter, int64_t version) {
    v1::LearnerProgressRequest progress;
    progress.set_version(version);  // a learner of one model's version: not math's
    v1::AdapterProgress* a = progress.add_adapters();
    a->set_adapter_id(IdOf(*c, adapter));
    a->set_version(version);
    ASSERT_TRUE(c->LearnerProgress(progress).ok());
  };
  report("code", 6);
  EXPECT_EQ(c->Get(set)->eval_round_version(), -1) << "another adapter's versions";
  report("math", 1);
  EXPECT_EQ(c->Get(set)->eval_round_version(), -1);
  report("math", 2);
  EXPECT_EQ(c->Get(set)->eval_round_version(), 2) << "math's version 2";
  EXPECT_EQ(c->Get(set)->prompts_pending(), 2);
}

TEST_F(AdaptersTest, ARefusedAdapterReportChangesNothing) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("math", 1)).ok());
  v1::LearnerProgressRequest progress;
  progress.set_version(3);
  v1::AdapterProgress* math = progress.add_adapters();
  math->set_adapter_id(IdOf(*c, "math"));
  math->set_version(2);
  math->set_groups_consumed(-1);  // out of bounds
  EXPECT_TRUE(IsError(c->LearnerProgress(progress).status(),
                      absl::StatusCode::kFailedPrecondition, {"groups_consumed"}));
  EXPECT_EQ(c->Stats().learner_version, 0);  // the model's part was not taken either
  EXPECT_EQ(c->Stats().adapters.at("math").version, 0);
  EXPECT_EQ(c->Stats().rejected_progress, 1);
  // A report of an adapter the coordinator does not know (deleted) is ignored.
  math->set_groups_consumed(0);
  math->set_adapter_id("ad-deleted");
  EXPECT_TRUE(c->LearnerProgress(progress).ok());
}

TEST_F(AdaptersTest, DeletingAnAdapterCancelsItsSetsAndANewOneMayTakeTheName) {
  config_.max_lag = 0;
  config_.groups_per_step = 1;
  auto c = Open();
  const std::string math_set = c->Submit(For("math", 3))->prompt_set_id();
  const std::string code_set = c->Submit(For("code", 3))->prompt_set_id();
  const std::string old_id = IdOf(*c, "math");
  absl::StatusOr<v1::DeleteAdapterResponse> deleted = c->DeleteAdapter("math");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->adapter_id(), old_id);
  EXPECT_EQ(deleted->prompt_sets_cancelled(), 1);
  EXPECT_EQ(c->Get(math_set)->state(), v1::PROMPT_SET_STATE_CANCELLED);
  EXPECT_EQ(c->Get(code_set)->state(), v1::PROMPT_SET_STATE_RUNNING);
  EXPECT_EQ(c->ListAdapters().adapters_size(), 1);
  EXPECT_TRUE(IsError(c->DeleteAdapter("math").status(), absl::StatusCode::kNotFound, {"math"}));
  // The learner's reply no longer lists it: the learner frees it.
  absl::StatusOr<v1::LearnerProgressResponse> reply = c->LearnerProgress(v1::LearnerProgressRequest());
  ASSERT_TRUE(reply.ok());
  ASSERT_EQ(reply->adapter_completions_size(), 1);
  EXPECT_EQ(reply->adapter_completions(0).adapter_id(), IdOf(*c, "code"));
  // The name again: a new adapter (new id, new settings allowed).
  ASSERT_TRUE(c->Submit(For("math", 1, 32)).ok());
  EXPECT_NE(IdOf(*c, "math"), old_id);
  EXPECT_EQ(c->ListAdapters().adapters(1).spec().rank(), 32);
}

// The adapters and their sets come back after a restart, from the plain log and from a
// compacted one: the same ids, settings and owners, and a deleted adapter stays deleted.
// Several learner ranks: each new adapter goes to the rank with the fewest live adapters, keeps
// it for its life (another's deletion moves nothing), and the learner's reply says it.
TEST_F(AdaptersTest, EachAdapterIsPlacedOnTheLeastLoadedLearnerRankForItsLife) {
  config_.learner_ranks = 2;
  config_.compact_log_bytes = 1;  // every record compacted: the placement is in the snapshot
  std::map<std::string, int32_t> placed;
  {
    auto c = Open();
    for (const std::string name : {"a", "b", "c"}) ASSERT_TRUE(c->Submit(For(name, 1)).ok());
    ASSERT_TRUE(c->DeleteAdapter("b").ok());  // rank 1 is empty again
    ASSERT_TRUE(c->Submit(For("d", 1)).ok());
    const v1::ListAdaptersResponse list = c->ListAdapters();
    for (const v1::AdapterStatus& a : list.adapters()) placed[a.spec().name()] = a.learner_rank();
    EXPECT_EQ(placed, (std::map<std::string, int32_t>{{"a", 0}, {"c", 0}, {"d", 1}}));
  }
  auto c = Open();  // restarted: the same placement
  absl::StatusOr<v1::LearnerProgressResponse> reply = c->LearnerProgress({});
  ASSERT_TRUE(reply.ok()) << reply.status();
  std::map<std::string, int32_t> replied;
  for (const v1::AdapterCompletions& a : reply->adapter_completions()) {
    replied[a.spec().name()] = a.learner_rank();
  }
  EXPECT_EQ(replied, placed);
}

// A lease names the learner rank its adapter is placed on (LeasedAdapter.learner_rank): where
// an actor whose addresses name {rank} takes the adapter's versions and sends its groups.
TEST_F(AdaptersTest, ALeaseNamesTheLearnerRankItsAdapterIsPlacedOn) {
  config_.learner_ranks = 2;
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("a", 2)).ok());
  ASSERT_TRUE(c->Submit(For("b", 2)).ok());
  const std::string actor = c->RegisterActor("x")->actor_id();
  absl::StatusOr<v1::LeaseResponse> lease = c->Lease(LeaseOf(actor, 8));
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::map<std::string, std::set<int32_t>> ranks;
  for (const v1::LeasedPrompt& p : lease->prompts()) {
    ranks[p.adapter().spec().name()].insert(p.adapter().learner_rank());
  }
  EXPECT_EQ(ranks, (std::map<std::string, std::set<int32_t>>{{"a", {0}}, {"b", {1}}}));
}

TEST_F(AdaptersTest, AdaptersSurviveARestartAndACompaction) {
  for (const bool compact : {false, true}) {
    SCOPED_TRACE(compact ? "compacted log" : "plain log");
    config_.compact_log_bytes = compact ? 1 : int64_t{64} << 20;
    std::string path = config_.log_path;
    config_.log_path = absl::StrCat(path, compact ? ".c" : ".p");
    v1::ListAdaptersResponse before;
    {
      auto c = Open();
      ASSERT_TRUE(c->Submit(For("math", 2, 4)).ok());
      ASSERT_TRUE(c->Submit(For("code", 2)).ok());
      ASSERT_TRUE(c->Submit(For("gone", 2)).ok());
      ASSERT_TRUE(c->DeleteAdapter("gone").ok());
      ASSERT_TRUE(c->Submit(For("code", 1)).ok());  // a compaction after the deletion
      before = c->ListAdapters();
    }
    auto c = Open();
    const v1::ListAdaptersResponse after = c->ListAdapters();
    ASSERT_EQ(after.adapters_size(), 2);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(after.adapters(i).adapter_id(), before.adapters(i).adapter_id());
      EXPECT_EQ(after.adapters(i).spec().SerializeAsString(),
                before.adapters(i).spec().SerializeAsString());
      EXPECT_EQ(after.adapters(i).created_unix_ms(), before.adapters(i).created_unix_ms());
    }
    EXPECT_EQ(after.adapters(1).prompt_sets_running(), 2);
    // Its sets lease with the adapter they were submitted with.
    const std::string actor = c->RegisterActor("a")->actor_id();
    absl::StatusOr<v1::LeaseResponse> lease = c->Lease(LeaseOf(actor, 8));
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->prompts_size(), 5);  // math 2, code 3; gone's are cancelled
    for (const v1::LeasedPrompt& p : lease->prompts()) {
      EXPECT_NE(p.adapter().spec().name(), "gone");
      EXPECT_FALSE(p.adapter().adapter_id().empty());
    }
    config_.log_path = path;
  }
}

}  // namespace
}  // namespace prl::coordinator
