// The /metrics endpoint as Prometheus sees it: every metric of the catalog is scraped over HTTP
// with its labels and values, the exposition passes `promtool check metrics`, and the server's
// failure modes (port taken, bad address) are clear errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "metrics/metrics_server.h"
#include "metrics/prl_metrics.h"
#include "tests/metrics/http_test_client.h"
#include "tests/status_testing.h"

extern "C" int openblas_get_num_threads(void);

namespace prl::metrics {
namespace {

// The value of the sample `series` (name plus its {labels} as exposed), if present.
std::optional<double> SampleValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series) || line.size() <= series.size() ||
        line[series.size()] != ' ') {
      continue;
    }
    double value;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return std::nullopt;
}

// `# TYPE <name> <type>` of every family exposed.
std::map<std::string, std::string> FamilyTypes(const std::string& exposition) {
  std::map<std::string, std::string> types;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, "# TYPE ")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() == 2) types[parts[0]] = parts[1];
  }
  return types;
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Pipes `input` into `promtool check metrics`.
CommandResult PromtoolCheckMetrics(const std::string& input) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/metrics_", getpid(), ".prom");
  std::ofstream(path) << input;
  const std::string command = absl::StrCat(PRL_PROMTOOL, " check metrics < '", path, "' 2>&1");
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) result.output.append(chunk, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::filesystem::remove(path);
  return result;
}

std::unique_ptr<MetricsServer> StartOnAnyPort(std::shared_ptr<prometheus::Registry> registry) {
  auto server = MetricsServer::Start({.address = "127.0.0.1:0"}, std::move(registry));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(server).value() : nullptr;
}

// Sets or observes every metric of the catalog with distinct values and returns, for each
// series, the value the scrape must show.
std::map<std::string, double> FillCatalog(prometheus::Registry& registry) {
  ProcessMetrics process(registry, Role::kLearner);
  CoordinatorMetrics coordinator(registry);
  ActorMetrics actor(registry);
  WeightSyncMetrics weights(registry);
  ReplayMetrics replay(registry);
  LearnerMetrics learner(registry, "ppo_clip");
  QuarantineMetrics quarantine(registry);
  IngestMetrics ingest(registry);
  AdapterLearnerMetrics adapter_learner(registry);

  process.weight_version.Set(7);

  coordinator.prompt_sets_active.Set(2);
  coordinator.prompts_pending.Set(40);
  coordinator.prompts_in_flight.Set(12);
  coordinator.prompts_done.Increment(100);
  coordinator.leases_expired.Increment(3);
  coordinator.leases_throttled.Increment(5);
  coordinator.leases_dropped.Increment(6);
  coordinator.leases_released.Increment(4);
  coordinator.prompts_failed.Increment(1);
  coordinator.RequestsRejected("completion_not_lease_holder").Increment(2);
  coordinator.PromptsLeased("actors-5d9c-x7k2p").Increment(60);
  coordinator.PromptsLeased("actors-5d9c-q4m8z").Increment(55);
  coordinator.PromptSetLeases("math").Increment(30);
  coordinator.PromptSetGroupsCompleted("math").Increment(28);
  const CoordinatorMetrics::Adapter adapter = coordinator.AdapterOf("team-a-math");
  adapter.version.Set(9);
  adapter.groups_trained.Set(72);
  adapter.groups_unconsumed.Set(3);
  adapter.prompts_in_flight.Set(5);
  adapter.prompt_sets_running.Set(2);
  const CoordinatorMetrics::Tenant tenant = coordinator.TenantOf("team-a");
  tenant.prompts_in_flight.Set(5);
  tenant.groups_completed.Increment(80);
  tenant.samples.Increment(640);
  tenant.groups_trained.Set(72);
  coordinator.AdapterOf("deleted").version.Set(1);
  coordinator.KeepAdapters({"team-a-math"});  // "deleted"'s series are gone
  adapter_learner.Update("team-a-math", [](const AdapterLearnerMetrics::Adapter& trainer) {
    trainer.steps.Increment(9);
    trainer.samples.Increment(576);
    trainer.tokens.Increment(4000);
    trainer.version.Set(9);
    trainer.reward_mean.Set(0.625);
    trainer.loss.Set(-0.5);
    trainer.lag_mean_versions.Set(1.25);
    trainer.step_seconds.Set(0.03);
    trainer.groups_waiting.Set(5);
  });
  adapter_learner.Update("deleted", [](const auto& trainer) { trainer.steps.Increment(1); });
  adapter_learner.Keep({"team-a-math"});

  actor.tokens_generated.Increment(123456);
  actor.prefill_tokens.Increment(4096);
  actor.rollout_length_tokens.Observe(100);
  actor.rollout_length_tokens.Observe(3000);
  actor.rollout_length_tokens.Observe(100000);  // an agent's long episode: a finite bucket
  actor.reward.Observe(1);
  actor.reward.Observe(0);
  actor.reward.Observe(0.5);
  actor.groups_pending.Set(4);
  actor.groups_in_flight.Set(8);
  actor.groups_done.Increment(21);
  actor.leases_lost.Increment(1);
  actor.sequences_running.Set(64);
  actor.sequences_waiting.Set(9);
  actor.preemptions.Increment(2);
  actor.kv_cache_used_bytes.Set(3 << 20);
  actor.kv_cache_capacity_bytes.Set(8 << 20);
  actor.RolloutsFinished("stop").Increment(30);
  actor.RolloutsFinished("length").Increment(4);
  actor.RewardFailures("timeout").Increment(1);

  weights.publish_seconds.Observe(0.02);
  weights.transfer_bytes.Increment(1e9);
  weights.transfer_seconds.Observe(1.5);
  weights.swap_stall_seconds.Observe(0.0008);

  replay.used_bytes.Set(1 << 20);
  replay.capacity_bytes.Set(1 << 30);
  replay.groups_ready.Set(6);
  replay.groups_leased.Set(2);
  AdvanceCounterTo(replay.groups_written, 50);
  AdvanceCounterTo(replay.bytes_written, 5e6);
  AdvanceCounterTo(replay.groups_redelivered, 1);
  AdvanceCounterTo(replay.dropped_stale, 3);
  AdvanceCounterTo(replay.dropped_full, 2);
  AdvanceCounterTo(quarantine.DeadLettered("token_id"), 2);
  ingest.groups.Increment(9);
  ingest.records.Increment(72);

  learner.step_seconds.Observe(4.2);
  learner.steps.Increment(7);
  learner.tokens.Increment(70000);
  learner.samples.Increment(448);
  learner.sample_max_lag_versions.Observe(0);
  learner.sample_max_lag_versions.Observe(3);
  learner.sample_mean_lag_versions.Observe(1.5);
  learner.step_max_lag_versions.Set(3);
  learner.max_lag_versions.Set(4);
  learner.loss.Set(-0.25);
  learner.importance_ratio_mean.Set(1.01);
  learner.importance_ratio_max.Set(2.5);
  learner.clipped_tokens_ratio.Set(0.125);
  learner.importance_weight_ess_ratio.Set(0.875);
  learner.logprob_mismatch_kl.Set(0.001);
  learner.entropy.Set(0.75);
  learner.grad_norm.Set(0.5);
  learner.learning_rate.Set(1e-6);

  const std::string loss = "{loss=\"ppo_clip\"}";
  return {
      {absl::StrCat("prl_build_info{role=\"learner\",version=\"", Version(), "\"}"), 1},
      {"prl_weight_version{role=\"learner\"}", 7},
      {"prl_replay_groups_dead_lettered_total{reason=\"token_id\"}", 2},
      {"prl_replay_ingest_groups_total", 9},
      {"prl_replay_ingest_records_total", 72},
      {"prl_prompt_sets_active", 2},
      {"prl_prompts_pending", 40},
      {"prl_prompts_in_flight", 12},
      {"prl_prompts_done_total", 100},
      {"prl_prompt_leases_expired_total", 3},
      {"prl_lease_requests_throttled_total", 5},
      {"prl_prompt_leases_dropped_total", 6},
      {"prl_prompt_leases_released_total", 4},
      {"prl_prompts_failed_total", 1},
      {"prl_coordinator_requests_rejected_total{reason=\"completion_not_lease_holder\"}", 2},
      {"prl_coordinator_requests_rejected_total{reason=\"progress_out_of_bounds\"}", 0},
      {"prl_coordinator_requests_rejected_total{reason=\"group_without_lease\"}", 0},
      {"prl_coordinator_requests_rejected_total{reason=\"release_not_lease_holder\"}", 0},
      {"prl_prompts_leased_total{actor=\"actors-5d9c-x7k2p\"}", 60},
      {"prl_prompts_leased_total{actor=\"actors-5d9c-q4m8z\"}", 55},
      {"prl_prompt_set_leases_total{set=\"math\"}", 30},
      {"prl_prompt_set_groups_completed_total{set=\"math\"}", 28},
      {"prl_adapter_version{adapter=\"team-a-math\"}", 9},
      {"prl_adapter_groups_trained{adapter=\"team-a-math\"}", 72},
      {"prl_adapter_groups_unconsumed{adapter=\"team-a-math\"}", 3},
      {"prl_adapter_prompts_in_flight{adapter=\"team-a-math\"}", 5},
      {"prl_adapter_prompt_sets_running{adapter=\"team-a-math\"}", 2},
      {"prl_tenant_prompts_in_flight{tenant=\"team-a\"}", 5},
      {"prl_tenant_groups_completed_total{tenant=\"team-a\"}", 80},
      {"prl_tenant_samples_total{tenant=\"team-a\"}", 640},
      {"prl_tenant_groups_trained{tenant=\"team-a\"}", 72},
      {"prl_tokens_generated_total", 123456},
      {"prl_prefill_tokens_total", 4096},
      {"prl_rollout_length_tokens_count", 3},
      {"prl_rollout_length_tokens_sum", 103100},
      {"prl_rollout_length_tokens_bucket{le=\"64\"}", 0},
      {"prl_rollout_length_tokens_bucket{le=\"128\"}", 1},
      {"prl_rollout_length_tokens_bucket{le=\"4096\"}", 2},
      {"prl_rollout_length_tokens_bucket{le=\"65536\"}", 2},
      {"prl_rollout_length_tokens_bucket{le=\"131072\"}", 3},
      {"prl_rollout_length_tokens_bucket{le=\"262144\"}", 3},
      {"prl_rollout_length_tokens_bucket{le=\"+Inf\"}", 3},
      {"prl_reward_count", 3},
      {"prl_reward_sum", 1.5},
      {"prl_reward_bucket{le=\"-0.25\"}", 0},
      {"prl_reward_bucket{le=\"0\"}", 1},
      {"prl_reward_bucket{le=\"0.5\"}", 2},
      {"prl_reward_bucket{le=\"1\"}", 3},
      {"prl_groups_pending", 4},
      {"prl_groups_in_flight", 8},
      {"prl_groups_done_total", 21},
      {"prl_actor_leases_lost_total", 1},
      {"prl_engine_sequences_running", 64},
      {"prl_engine_sequences_waiting", 9},
      {"prl_engine_preemptions_total", 2},
      {"prl_kv_cache_used_bytes", 3 << 20},
      {"prl_kv_cache_capacity_bytes", 8 << 20},
      {"prl_rollouts_finished_total{reason=\"stop\"}", 30},
      {"prl_rollouts_finished_total{reason=\"length\"}", 4},
      {"prl_rollouts_finished_total{reason=\"abort\"}", 0},
      {"prl_reward_failures_total{reason=\"timeout\"}", 1},
      {"prl_reward_failures_total{reason=\"error\"}", 0},
      {"prl_weight_publish_seconds_count", 1},
      {"prl_weight_publish_seconds_bucket{le=\"0.01\"}", 0},
      {"prl_weight_publish_seconds_bucket{le=\"0.025\"}", 1},
      {"prl_weight_transfer_bytes_total", 1e9},
      {"prl_weight_transfer_seconds_sum", 1.5},
      {"prl_weight_transfer_seconds_bucket{le=\"2.5\"}", 1},
      {"prl_weight_swap_stall_seconds_bucket{le=\"0.0005\"}", 0},
      {"prl_weight_swap_stall_seconds_bucket{le=\"0.001\"}", 1},
      {"prl_replay_used_bytes", 1 << 20},
      {"prl_replay_capacity_bytes", 1 << 30},
      {"prl_replay_groups_ready", 6},
      {"prl_replay_groups_leased", 2},
      {"prl_replay_groups_written_total", 50},
      {"prl_replay_bytes_written_total", 5e6},
      {"prl_replay_groups_redelivered_total", 1},
      {"prl_replay_groups_dropped_total{reason=\"stale\"}", 3},
      {"prl_replay_groups_dropped_total{reason=\"full\"}", 2},
      {"prl_replay_groups_dead_lettered_total{reason=\"context\"}", 0},
      {"prl_replay_groups_dead_lettered_total{reason=\"future_version\"}", 0},
      {"prl_replay_groups_dead_lettered_total{reason=\"corrupt\"}", 0},
      {"prl_learner_step_seconds_sum", 4.2},
      {"prl_learner_step_seconds_bucket{le=\"2.5\"}", 0},
      {"prl_learner_step_seconds_bucket{le=\"5\"}", 1},
      {"prl_learner_steps_total", 7},
      {"prl_learner_tokens_total", 70000},
      {"prl_learner_samples_total", 448},
      {"prl_sample_max_lag_versions_bucket{le=\"0\"}", 1},
      {"prl_sample_max_lag_versions_bucket{le=\"2\"}", 1},
      {"prl_sample_max_lag_versions_bucket{le=\"3\"}", 2},
      {"prl_sample_mean_lag_versions_bucket{le=\"1\"}", 0},
      {"prl_sample_mean_lag_versions_bucket{le=\"2\"}", 1},
      {"prl_learner_step_max_lag_versions", 3},
      {"prl_learner_max_lag_versions", 4},
      {"prl_learner_loss" + loss, -0.25},
      {"prl_importance_ratio_mean", 1.01},
      {"prl_importance_ratio_max", 2.5},
      {"prl_importance_clipped_tokens_ratio" + loss, 0.125},
      {"prl_importance_weight_ess_ratio" + loss, 0.875},
      {"prl_logprob_mismatch_kl", 0.001},
      {"prl_learner_entropy", 0.75},
      {"prl_learner_grad_norm", 0.5},
      {"prl_learner_learning_rate", 1e-6},
      {"prl_adapter_learner_steps_total{adapter=\"team-a-math\"}", 9},
      {"prl_adapter_learner_samples_total{adapter=\"team-a-math\"}", 576},
      {"prl_adapter_learner_tokens_total{adapter=\"team-a-math\"}", 4000},
      {"prl_adapter_learner_version{adapter=\"team-a-math\"}", 9},
      {"prl_adapter_learner_reward_mean{adapter=\"team-a-math\"}", 0.625},
      {"prl_adapter_learner_loss{adapter=\"team-a-math\"}", -0.5},
      {"prl_adapter_learner_lag_mean_versions{adapter=\"team-a-math\"}", 1.25},
      {"prl_adapter_learner_step_seconds{adapter=\"team-a-math\"}", 0.03},
      {"prl_adapter_learner_groups_waiting{adapter=\"team-a-math\"}", 5},
  };
}

// One server with the whole catalog filled in, scraped once for the tests that only read.
class CatalogScrape : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto registry = std::make_shared<prometheus::Registry>();
    expected_ = new std::map<std::string, double>(FillCatalog(*registry));
    auto server = MetricsServer::Start({.address = "127.0.0.1:0"}, registry);
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_GT((*server)->port(), 0);
    absl::StatusOr<std::string> scrape = HttpGet((*server)->port(), "/metrics");
    ASSERT_TRUE(scrape.ok()) << scrape.status();
    scrape_ = new std::string(*std::move(scrape));
  }
  static void TearDownTestSuite() {
    delete expected_;
    delete scrape_;
  }
  void SetUp() override { ASSERT_NE(scrape_, nullptr) << "the catalog scrape failed"; }

  static std::map<std::string, double>* expected_;  // series -> value it must show
  static std::string* scrape_;                      // the /metrics body
};
std::map<std::string, double>* CatalogScrape::expected_ = nullptr;
std::string* CatalogScrape::scrape_ = nullptr;

TEST_F(CatalogScrape, ShowsEveryCatalogMetricWithItsLabelsAndValue) {
  for (const auto& [series, value] : *expected_) {
    std::optional<double> got = SampleValue(*scrape_, series);
    ASSERT_TRUE(got.has_value()) << series << " missing from:\n" << *scrape_;
    EXPECT_DOUBLE_EQ(*got, value) << series;
  }
  // A deleted adapter's series are dropped (CoordinatorMetrics::KeepAdapters,
  // AdapterLearnerMetrics::Keep).
  EXPECT_EQ(scrape_->find("adapter=\"deleted\""), std::string::npos);
  std::optional<double> start = SampleValue(*scrape_, "prl_process_start_time_seconds");
  ASSERT_TRUE(start.has_value());
  EXPECT_GT(*start, 1.6e9);  // a unix time in seconds, not ms or ns
}

TEST_F(CatalogScrape, PassesPromtoolLint) {
  ASSERT_TRUE(std::filesystem::exists(PRL_PROMTOOL))
      << PRL_PROMTOOL << " not found: run scripts/setup.sh (it installs Debian's prometheus "
      << "package, which provides promtool)";
  CommandResult lint = PromtoolCheckMetrics(*scrape_);
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
  EXPECT_EQ(lint.output, "") << "promtool check metrics complained about:\n" << *scrape_;
}

TEST_F(CatalogScrape, NamesHaveThePrefixAndOnlyCountersEndInTotal) {
  int prl_families = 0;
  for (const auto& [name, type] : FamilyTypes(*scrape_)) {
    ++prl_families;
    EXPECT_TRUE(absl::StartsWith(name, "prl_")) << name;
    EXPECT_EQ(type == "counter", absl::EndsWith(name, "_total")) << name << " is a " << type;
  }
  EXPECT_GE(prl_families, 40);
}

TEST(MetricsServer, CatalogBuiltTwiceOnOneRegistrySharesItsMetrics) {
  prometheus::Registry registry;
  ActorMetrics first(registry);
  ActorMetrics second(registry);
  first.tokens_generated.Increment(5);
  EXPECT_EQ(&first.tokens_generated, &second.tokens_generated);
  EXPECT_EQ(&first.RolloutsFinished("stop"), &second.RolloutsFinished("stop"));
  EXPECT_EQ(&first.rollout_length_tokens, &second.rollout_length_tokens);
  EXPECT_DOUBLE_EQ(second.tokens_generated.Value(), 5);
}

TEST(MetricsServer, AdvanceCounterToNeverGoesBackwards) {
  prometheus::Registry registry;
  ReplayMetrics replay(registry);
  AdvanceCounterTo(replay.dropped_stale, 10);
  EXPECT_DOUBLE_EQ(replay.dropped_stale.Value(), 10);
  AdvanceCounterTo(replay.dropped_stale, 4);  // the source restarted
  EXPECT_DOUBLE_EQ(replay.dropped_stale.Value(), 10);
  AdvanceCounterTo(replay.dropped_stale, 12);
  EXPECT_DOUBLE_EQ(replay.dropped_stale.Value(), 12);
}

TEST(MetricsServer, TakenPortIsAClearError) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = StartOnAnyPort(registry);
  ASSERT_NE(first, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", first->port());
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start({.address = address}, registry);
  EXPECT_TRUE(testing::IsError(second.status(), absl::StatusCode::kUnavailable,
                               {address, "Address already in use", "port 0"}));
  // The first server still serves.
  EXPECT_TRUE(HttpGet(first->port(), "/metrics").ok());
}

TEST(MetricsServer, MalformedAddressIsInvalidArgument) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (const char* address : {"not-an-address", "127.0.0.1:99999", ""}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start({.address = address}, registry);
    EXPECT_TRUE(
        testing::IsError(server.status(), absl::StatusCode::kInvalidArgument, {"host:port"}))
        << address;
  }
  EXPECT_TRUE(testing::IsError(MetricsServer::Start({}, nullptr).status(),
                               absl::StatusCode::kInvalidArgument, {"registry"}));
}

TEST(MetricsServer, TwoServersOnDifferentPortsServeTheirOwnRegistries) {
  auto actor_registry = std::make_shared<prometheus::Registry>();
  auto learner_registry = std::make_shared<prometheus::Registry>();
  ProcessMetrics actor(*actor_registry, Role::kActor);
  ProcessMetrics learner(*learner_registry, Role::kLearner);
  actor.weight_version.Set(3);
  learner.weight_version.Set(4);

  auto actor_server = StartOnAnyPort(actor_registry);
  auto learner_server = StartOnAnyPort(learner_registry);
  ASSERT_NE(actor_server, nullptr);
  ASSERT_NE(learner_server, nullptr);
  EXPECT_NE(actor_server->port(), learner_server->port());

  absl::StatusOr<std::string> actor_scrape = HttpGet(actor_server->port(), "/metrics");
  absl::StatusOr<std::string> learner_scrape = HttpGet(learner_server->port(), "/metrics");
  ASSERT_TRUE(actor_scrape.ok()) << actor_scrape.status();
  ASSERT_TRUE(learner_scrape.ok()) << learner_scrape.status();
  EXPECT_EQ(SampleValue(*actor_scrape, "prl_weight_version{role=\"actor\"}"), 3);
  EXPECT_EQ(SampleValue(*learner_scrape, "prl_weight_version{role=\"learner\"}"), 4);
  EXPECT_FALSE(SampleValue(*actor_scrape, "prl_weight_version{role=\"learner\"}").has_value());

  // Stopping one leaves the other serving.
  const int actor_port = actor_server->port();
  actor_server.reset();
  EXPECT_FALSE(HttpGet(actor_port, "/metrics").ok());
  EXPECT_TRUE(HttpGet(learner_server->port(), "/metrics").ok());
}

// Regression: with prometheus-cpp's civetweb server, a scrape crashed every prl process that
// links OpenBLAS (civetweb's 100 KB worker stacks minus libopenblas's 61 KB of static TLS).
// This binary links OpenBLAS too, and scrapes the way Prometheus and curl do (HTTP/1.1).
TEST(MetricsServer, ServesHttp11ScrapesInAProcessThatLinksOpenBlas) {
  ASSERT_GE(openblas_get_num_threads(), 1);  // libopenblas is loaded, with its TLS
  auto registry = std::make_shared<prometheus::Registry>();
  ProcessMetrics process(*registry, Role::kActor);
  auto server = StartOnAnyPort(registry);
  ASSERT_NE(server, nullptr);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> r =
        HttpExchange(server->port(),
                     "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Prometheus/2.42.0\r\n"
                     "Accept: text/plain;version=0.0.4\r\nAccept-Encoding: gzip\r\n\r\n");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(absl::StartsWith(*r, "HTTP/1.1 200 OK\r\n")) << *r;
    EXPECT_TRUE(absl::StrContains(*r, "Content-Type: text/plain; version=0.0.4")) << *r;
    EXPECT_TRUE(absl::StrContains(*r, "prl_build_info{")) << *r;
  }
}

TEST(MetricsServer, OtherPathsAre404OtherMethods405AndHeadHasNoBody) {
  auto registry = std::make_shared<prometheus::Registry>();
  ProcessMetrics process(*registry, Role::kActor);
  auto server = StartOnAnyPort(registry);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::string> missing =
      HttpExchange(server->port(), "GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(absl::StartsWith(*missing, "HTTP/1.1 404 ")) << *missing;
  absl::StatusOr<std::string> post =
      HttpExchange(server->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(post.ok());
  EXPECT_TRUE(absl::StartsWith(*post, "HTTP/1.1 405 ")) << *post;
  absl::StatusOr<std::string> head =
      HttpExchange(server->port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(absl::StartsWith(*head, "HTTP/1.1 200 OK")) << *head;
  EXPECT_TRUE(absl::EndsWith(*head, "\r\n\r\n")) << *head;
  // A client that never sends its request does not block the next scrape forever.
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  options.request_timeout_ms = 200;
  auto quick = MetricsServer::Start(options, registry);
  ASSERT_TRUE(quick.ok());
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*quick)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_TRUE(HttpGet((*quick)->port(), "/metrics").ok());
  close(idle);
}

}  // namespace
}  // namespace prl::metrics
