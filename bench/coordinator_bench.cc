#include "bench/coordinator_bench.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/stats.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "core/status_macros.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"

namespace prl::bench {

namespace {

namespace v1 = prl::v1;
using Clock = std::chrono::steady_clock;

double MillisBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// What one small append costs on the log's file system: write + fdatasync, in microseconds
// (the ceiling of an fsync per request is one request per this).
absl::StatusOr<double> FdatasyncMicros(const std::string& dir) {
  const std::string path = dir + "/fsync-probe";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const char bytes[128] = {};
  constexpr int kRounds = 200;
  const auto start = Clock::now();
  bool ok = true;
  for (int i = 0; i < kRounds && ok; ++i) {
    ok = write(fd, bytes, sizeof(bytes)) == sizeof(bytes) && fdatasync(fd) == 0;
  }
  const double micros = MillisBetween(start, Clock::now()) * 1000.0 / kRounds;
  close(fd);
  unlink(path.c_str());
  if (!ok) return absl::InternalError(absl::StrCat("cannot write and fsync ", path));
  return micros;
}

struct ModeResult {
  double completions_per_s = 0;
  double lease_p50_ms = 0, lease_p99_ms = 0, complete_p50_ms = 0, complete_p99_ms = 0;
  double fsyncs_per_completion = 0;
  int64_t errors = 0;
};

// Per actor thread: what it measured inside the window.
struct ActorTally {
  int64_t completions = 0, errors = 0;
  std::vector<double> lease_ms, complete_ms;
};

absl::Status SubmitPrompts(coordinator::Coordinator& c, int64_t prompts, int samples,
                           const std::string& name = "bench") {
  constexpr int64_t kPerSet = 25'000;
  for (int64_t done = 0; done < prompts; done += kPerSet) {
    v1::SubmitPromptSetRequest r;
    r.set_name(name);
    for (int64_t i = 0; i < std::min(kPerSet, prompts - done); ++i) {
      v1::Prompt* p = r.add_prompts();
      for (int t = 0; t < 8; ++t) p->mutable_tokens()->add_ids(static_cast<int32_t>(1 + t));
    }
    r.set_samples_per_prompt(samples);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(64);
    r.mutable_reward()->set_name("exact_match");
    PRL_RETURN_IF_ERROR(c.Submit(r).status());
  }
  return absl::OkStatus();
}

// The measured window: calls that start at or after `start` are timed, completions
// acknowledged by `end` count, and no actor starts a call after `end`.
struct Window {
  Clock::time_point start, end;
};

// One actor: a channel of its own and one call outstanding at a time, Lease (one prompt) then
// Complete, each issued from the previous call's completion callback (gRPC's callback API), so
// that 64 actors cost the process no 64 threads waking for every reply: the client side takes
// as little of the machine's CPU from the server as it can.
class BenchActor {
 public:
  BenchActor(const std::string& target, int samples, const Window* window, ActorTally* tally)
      : samples_(samples), window_(window), tally_(tally) {
    grpc::ChannelArguments args = rpc::ChannelArgs(int64_t{16} << 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    stub_ = v1::ActorControl::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  }

  // 64 channels connecting at once may meet a full accept queue: each Register waits for its
  // connection and is retried.
  absl::Status Register() {
    for (int attempt = 0; attempt < 10; ++attempt) {
      grpc::ClientContext context;
      context.set_wait_for_ready(true);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::RegisterRequest request;
      v1::RegisterResponse response;
      request.set_actor_name("bench");
      request.mutable_capacity()->set_max_samples_per_prompt(samples_);
      if (stub_->Register(&context, request, &response).ok()) {
        lease_.set_actor_id(response.actor_id());
        lease_.set_max_prompts(1);
        done_.set_actor_id(response.actor_id());
        return absl::OkStatus();
      }
    }
    return absl::UnavailableError(
        "bench coordinator: an actor could not register in 10 attempts (loopback gRPC)");
  }

  // Starts the loop; `finished` is called once, after the last call of the window returned.
  void Start(std::function<void()> finished) {
    finished_ = std::move(finished);
    Lease();
  }

 private:
  void Lease() {
    t0_ = Clock::now();
    if (t0_ >= window_->end) return finished_();
    context_ = std::make_unique<grpc::ClientContext>();
    leased_.Clear();
    stub_->async()->LeasePrompts(context_.get(), &lease_, &leased_,
                                 [this](grpc::Status status) { OnLeased(status); });
  }

  void OnLeased(const grpc::Status& status) {
    t1_ = Clock::now();
    const bool measured = t0_ >= window_->start;
    if (!status.ok() || leased_.prompts_size() == 0) {  // not a lease: not timed as one
      tally_->errors += measured ? 1 : 0;
      return Lease();
    }
    if (measured) tally_->lease_ms.push_back(MillisBetween(t0_, t1_));
    const v1::LeasedPrompt& p = leased_.prompts(0);
    done_.set_lease_id(p.lease_id());
    v1::GroupResult* result = done_.mutable_result();
    result->Clear();
    result->set_prompt_index(p.prompt_index());
    for (int i = 0; i < samples_; ++i) {
      result->add_rewards(i % 2);
      result->add_completion_tokens(32);
    }
    context_ = std::make_unique<grpc::ClientContext>();
    completed_.Clear();
    stub_->async()->Complete(context_.get(), &done_, &completed_,
                             [this](grpc::Status status) { OnCompleted(status); });
  }

  void OnCompleted(const grpc::Status& status) {
    const Clock::time_point t2 = Clock::now();
    if (t0_ >= window_->start) {
      tally_->complete_ms.push_back(MillisBetween(t1_, t2));
      if (status.ok() && completed_.accepted() && t2 <= window_->end) {
        ++tally_->completions;
      } else if (!status.ok()) {
        ++tally_->errors;
      }
    }
    Lease();
  }

  const int samples_;
  const Window* window_;
  ActorTally* tally_;
  std::unique_ptr<v1::ActorControl::Stub> stub_;
  std::function<void()> finished_;
  // The call in flight (one at a time): its context, request and response.
  std::unique_ptr<grpc::ClientContext> context_;
  v1::LeaseRequest lease_;
  v1::LeaseResponse leased_;
  v1::CompleteRequest done_;
  v1::CompleteResponse completed_;
  Clock::time_point t0_, t1_;  // the lease's start and end
};

absl::StatusOr<ModeResult> RunMode(const CoordinatorBenchOptions& o, bool group_commit,
                                   const std::string& log_path) {
  coordinator::CoordinatorConfig config;
  config.log_path = log_path;
  config.lease_ms = 600'000;  // no lease expires during the run: no heartbeats needed
  config.heartbeat_ms = 60'000;
  config.max_pending_prompts = int64_t{100} << 20;
  config.vocab_size = 1024;
  config.max_position_embeddings = 4096;
  config.validate_reward = [](const v1::RewardSpec&) { return absl::OkStatus(); };
  config.group_commit = group_commit;
  PRL_ASSIGN_OR_RETURN(auto coordinator, coordinator::Coordinator::Open(config));
  if (o.unrunnable_prompts > 0) {
    PRL_RETURN_IF_ERROR(SubmitPrompts(*coordinator, o.unrunnable_prompts,
                                      2 * o.samples_per_prompt, "unrunnable"));
  }
  // Enough prompts for 60,000 completions/s.
  const auto prompts = static_cast<int64_t>(60'000 * o.seconds * 1.2) + 10'000;
  PRL_RETURN_IF_ERROR(SubmitPrompts(*coordinator, prompts, o.samples_per_prompt));
  PRL_ASSIGN_OR_RETURN(auto server,
                       coordinator::CoordinatorServer::Start(coordinator.get(), "127.0.0.1:0"));
  const std::string target = absl::StrCat("127.0.0.1:", server->port());

  Window window;
  std::vector<ActorTally> tallies(static_cast<size_t>(o.actors));
  std::vector<std::unique_ptr<BenchActor>> actors;
  for (int a = 0; a < o.actors; ++a) {
    actors.push_back(std::make_unique<BenchActor>(target, o.samples_per_prompt, &window,
                                                  &tallies[static_cast<size_t>(a)]));
    PRL_RETURN_IF_ERROR(actors.back()->Register());
  }
  const auto warmup = std::chrono::duration<double>(o.seconds / 10);
  window.start = Clock::now() + std::chrono::duration_cast<Clock::duration>(warmup);
  window.end = window.start +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::mutex mu;
  std::condition_variable all_finished;
  int finished = 0;
  for (auto& actor : actors) {
    actor->Start([&] {
      std::lock_guard<std::mutex> lock(mu);
      if (++finished == o.actors) all_finished.notify_one();
    });
  }
  std::this_thread::sleep_until(window.start);
  const coordinator::PromptLogStats at_start = coordinator->LogStats();
  std::this_thread::sleep_until(window.end);
  const coordinator::PromptLogStats at_end = coordinator->LogStats();
  {
    std::unique_lock<std::mutex> lock(mu);
    all_finished.wait(lock, [&] { return finished == o.actors; });
  }
  actors.clear();
  server->Shutdown();

  ModeResult r;
  std::vector<double> lease_ms, complete_ms;
  int64_t completions = 0;
  for (const ActorTally& t : tallies) {
    completions += t.completions;
    r.errors += t.errors;
    lease_ms.insert(lease_ms.end(), t.lease_ms.begin(), t.lease_ms.end());
    complete_ms.insert(complete_ms.end(), t.complete_ms.begin(), t.complete_ms.end());
  }
  r.completions_per_s = static_cast<double>(completions) / o.seconds;
  r.lease_p50_ms = Percentile(lease_ms, 0.50);
  r.lease_p99_ms = Percentile(lease_ms, 0.99);
  r.complete_p50_ms = Percentile(complete_ms, 0.50);
  r.complete_p99_ms = Percentile(complete_ms, 0.99);
  const int64_t records = at_end.records - at_start.records;
  r.fsyncs_per_completion =
      records > 0 ? static_cast<double>(at_end.fsyncs - at_start.fsyncs) / records : 0.0;
  return r;
}

// The prompt log alone, without gRPC: `actors` threads appending completion records (each
// durable before the next) for half the measured time; appends per second.
absl::StatusOr<double> LogAppendsPerSecond(const CoordinatorBenchOptions& o, bool group_commit,
                                           const std::string& path) {
  coordinator::PromptLogOptions options;
  options.group_commit = group_commit;
  PRL_ASSIGN_OR_RETURN(coordinator::PromptLog::Opened opened,
                       coordinator::PromptLog::Open(path, options));
  coordinator::PromptLog* log = opened.log.get();
  v1::LogRecord record;
  record.mutable_completed()->set_prompt_set_id("ps-bench");
  for (int i = 0; i < o.samples_per_prompt; ++i) {
    record.mutable_completed()->mutable_result()->add_rewards(i % 2);
    record.mutable_completed()->mutable_result()->add_completion_tokens(32);
  }
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(o.seconds / 2));
  std::atomic<int64_t> appends{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int a = 0; a < o.actors; ++a) {
    threads.emplace_back([&, a] {
      v1::LogRecord mine = record;
      for (int64_t i = 0; Clock::now() < end; ++i) {
        mine.mutable_completed()->mutable_result()->set_prompt_index(a * 1'000'000'000LL + i);
        if (!log->Append(mine).ok()) {
          failed.store(true);
          return;
        }
        appends.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = MillisBetween(start, Clock::now()) / 1000.0;
  if (failed.load()) return absl::InternalError(absl::StrCat("cannot append to ", path));
  return static_cast<double>(appends.load()) / seconds;
}

}  // namespace

absl::StatusOr<Report> RunCoordinatorBench(const CoordinatorBenchOptions& o) {
  // Bounded: every actor is a channel, every second of a mode ~70,000 submitted prompts, and
  // the unrunnable set (twice the samples) must stay within max_samples_per_prompt (1024).
  const auto bad = [](const char* flag, const char* expected, const std::string& found) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench coordinator: ", flag, ": expected ", expected, ", found ", found));
  };
  if (o.actors < 1 || o.actors > 4096) return bad("--actors", "1 to 4096", absl::StrCat(o.actors));
  if (!(o.seconds > 0 && o.seconds <= 600)) {
    return bad("--seconds", "more than 0 and at most 600", absl::StrCat(o.seconds));
  }
  if (o.samples_per_prompt < 1 || o.samples_per_prompt > 512) {
    return bad("--samples", "1 to 512", absl::StrCat(o.samples_per_prompt));
  }
  if (o.unrunnable_prompts < 0 || o.unrunnable_prompts > 10'000'000) {
    return bad("--unrunnable", "0 to 10000000", absl::StrCat(o.unrunnable_prompts));
  }
  namespace fs = std::filesystem;
  const fs::path dir =
      o.dir.empty() ? fs::temp_directory_path() / absl::StrCat("prl-bench-coordinator-", getpid())
                    : fs::path(o.dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  PRL_ASSIGN_OR_RETURN(const double fsync_us, FdatasyncMicros(dir.string()));
  Report report;
  report.bench = "coordinator";
  report.machine = MachineInfo();
  report.machine.emplace_back("load", [] {
    double load[3] = {};
    return getloadavg(load, 3) == 3 ? absl::StrFormat("%.2f %.2f %.2f", load[0], load[1], load[2])
                                    : std::string("unknown");
  }());
  report.setup = {
      {"actors", absl::StrFormat("%d, each with its own gRPC channel over loopback and one call "
                                 "outstanding, looping Lease (1 prompt) then Complete (%d "
                                 "samples); driven by gRPC's callback API (no thread per actor)",
                                 o.actors, o.samples_per_prompt)},
      {"unrunnable",
       absl::StrFormat("%d prompts of a set no actor can run (%d samples per prompt, the actors "
                       "declare %d), queued ahead of the measured ones",
                       o.unrunnable_prompts, 2 * o.samples_per_prompt, o.samples_per_prompt)},
      {"server",
       "Coordinator + CoordinatorServer in the same process (LeasePrompts and Complete "
       "on gRPC's callback API; a completion is answered by the log's flusher once "
       "durable)"},
      {"log", absl::StrFormat("prompt log in %s; one small write + fdatasync there takes %.0f us",
                              dir.string(), fsync_us)},
      {"window", absl::StrFormat("%.1f s per mode after a %.1f s warm-up; a completion counts "
                                 "when Complete returned (durable)",
                                 o.seconds, o.seconds / 10)},
      {"baseline",
       "an fsync per request (group commit off: each append is written and "
       "fsync'd under the coordinator's mutex), measured in the same run"},
      {"ceiling",
       "group commit with the log on tmpfs (/dev/shm, an fsync costs nothing): what gRPC and the "
       "coordinator allow on this machine; 0 where /dev/shm is not a tmpfs"},
      {"log_appends", absl::StrFormat("the prompt log alone (no gRPC, no coordinator): %d threads "
                                      "appending completion records, each durable before the "
                                      "next, for %.1f s per mode",
                                      o.actors, o.seconds / 2)}};
  // The ceiling: group commit with the log on tmpfs, where an fsync costs nothing, so what is
  // left is gRPC and the coordinator. Skipped where /dev/shm is not a tmpfs.
  struct statfs shm = {};
  const bool has_tmpfs = statfs("/dev/shm", &shm) == 0 && shm.f_type == TMPFS_MAGIC;
  const fs::path ceiling_dir =
      fs::path("/dev/shm") / absl::StrCat("prl-bench-coordinator-", getpid());
  std::error_code ceiling_ec;
  const bool ceiling = has_tmpfs && (fs::create_directories(ceiling_dir, ceiling_ec), !ceiling_ec);
  ModeResult modes[3];
  const char* const names[3] = {"group commit", "fsync per request",
                                "group commit on tmpfs (no fsync cost)"};
  for (int m = 0; m < 3; ++m) {
    if (m == 2 && !ceiling) continue;
    const bool group = m != 1;
    const std::string log = m == 2
                                ? (ceiling_dir / "ceiling.log").string()
                                : (dir / (group ? "group-commit.log" : "fsync-each.log")).string();
    PRL_ASSIGN_OR_RETURN(modes[m], RunMode(o, group, log));
    fs::remove(log, ec);
    fs::remove(log + ".lock", ec);
    if (o.progress) {
      std::fprintf(stderr,
                   "bench coordinator: %s: %.0f completions/s, lease p50 %.2f ms p99 %.2f ms, "
                   "%.3f fsyncs per completion, %lld errors\n",
                   names[m], modes[m].completions_per_s, modes[m].lease_p50_ms,
                   modes[m].lease_p99_ms, modes[m].fsyncs_per_completion,
                   static_cast<long long>(modes[m].errors));
    }
  }
  if (ceiling) fs::remove_all(ceiling_dir, ec);
  double log_rate[2];
  for (int m = 0; m < 2; ++m) {
    const std::string log = (dir / (m == 0 ? "log-group.log" : "log-each.log")).string();
    PRL_ASSIGN_OR_RETURN(log_rate[m], LogAppendsPerSecond(o, m == 0, log));
    fs::remove(log, ec);
    fs::remove(log + ".lock", ec);
  }
  if (o.progress) {
    std::fprintf(stderr,
                 "bench coordinator: prompt log alone: %.0f appends/s with group commit, %.0f "
                 "with an fsync per append\n",
                 log_rate[0], log_rate[1]);
  }
  if (o.dir.empty()) fs::remove_all(dir, ec);
  const ModeResult& g = modes[0];
  const ModeResult& f = modes[1];
  report.results = {
      {"completions_group_commit", g.completions_per_s, "1/s", "completions_fsync_each",
       f.completions_per_s},
      {"lease_p50_group_commit", g.lease_p50_ms, "ms", "lease_p50_fsync_each", f.lease_p50_ms},
      {"lease_p99_group_commit", g.lease_p99_ms, "ms", "lease_p99_fsync_each", f.lease_p99_ms},
      {"complete_p50_group_commit", g.complete_p50_ms, "ms", "complete_p50_fsync_each",
       f.complete_p50_ms},
      {"complete_p99_group_commit", g.complete_p99_ms, "ms", "complete_p99_fsync_each",
       f.complete_p99_ms},
      {"fsyncs_per_completion", g.fsyncs_per_completion, "fsyncs", "fsyncs_per_completion_each",
       f.fsyncs_per_completion},
      // Its ratio: the most any batching of fsyncs could gain over an fsync per request here.
      {"completions_tmpfs_ceiling", modes[2].completions_per_s, "1/s", "completions_fsync_each",
       f.completions_per_s},
      {"log_appends_group_commit", log_rate[0], "1/s", "log_appends_fsync_each", log_rate[1]},
      {"fdatasync_latency", fsync_us, "us", "", 0.0},
      {"errors_group_commit", static_cast<double>(g.errors), "calls", "errors_fsync_each",
       static_cast<double>(f.errors)}};
  return report;
}

}  // namespace prl::bench
