#include "bench/broadcast_bench.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/model_bench.h"
#include "bench/stats.h"
#include "config/run_config.h"
#include "core/child_process.h"
#include "core/enum_names.h"
#include "core/net_address.h"
#include "core/status_macros.h"
#include "inference_engine/engine.h"
#include "model/presets.h"
#include "roles/weight_transports.h"

namespace prl::bench {

namespace {

constexpr int64_t kPromptLen = 64;
constexpr int32_t kMaxTokens = 512;

int64_t MonotonicNs() {  // one clock for every process of the machine
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

absl::StatusOr<config::WeightTransport> ParseTransport(const std::string& name) {
  PRL_ASSIGN_OR_RETURN(const config::WeightTransport t,
                       ParseEnum(config::kWeightTransportNames, name, "--transports"));
  if (t == config::WeightTransport::kNccl) {
    return absl::InvalidArgumentError(
        "--transports: nccl needs a process per GPU and is not benchmarked here; expected shm, "
        "grpc or cuda_ipc");
  }
  return t;
}

config::RunConfig TransportConfig(const std::string& transport, const std::string& run_name,
                                  const std::string& listen) {
  config::RunConfig c;
  c.run.name = run_name;
  c.broadcast.transport = *ParseTransport(transport);
  c.broadcast.listen = listen;
  return c;
}

// The median time of a device-to-device (or host) copy of the weights: the floor of any
// transport that delivers a copy.
absl::StatusOr<double> CopyFloorMs(const ParameterSet& weights) {
  PRL_ASSIGN_OR_RETURN(ParameterSet other,
                       ParameterSet::Allocate(weights.config, weights.buffer.device(), false));
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const int64_t start = MonotonicNs();
    PRL_RETURN_IF_ERROR(CopyBytes(other.data(), other.buffer.device(), weights.data(),
                                  weights.buffer.device(), weights.buffer.bytes()));
    ms.push_back(static_cast<double>(MonotonicNs() - start) / 1e6);
  }
  return Median(ms);
}

// Follows the subscriber's log (kept open, read from where it stopped): Await returns the words
// of the next line that starts with `want`, or an error when the child dies (naming its log) or
// the deadline passes. Polled every millisecond: the latencies come from the child's own clock
// readings, not from when this reads them.
class ChildLines {
 public:
  ChildLines(ChildProcess* child, std::string path) : child_(child), path_(std::move(path)) {}
  ~ChildLines() {
    if (fd_ >= 0) close(fd_);
  }

  absl::StatusOr<std::vector<std::string>> Await(const std::string& want, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (fd_ < 0) fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);  // once the child made it
      char chunk[4096];
      ssize_t n = 0;
      while (fd_ >= 0 && (n = read(fd_, chunk, sizeof(chunk))) > 0) pending_.append(chunk, n);
      for (size_t eol; (eol = pending_.find('\n')) != std::string::npos;) {
        std::istringstream words(pending_.substr(0, eol));
        pending_.erase(0, eol + 1);
        std::vector<std::string> w;
        for (std::string x; words >> x;) w.push_back(x);
        if (!w.empty() && w[0] == want) return w;
      }
      if (!child_->running()) {
        return absl::InternalError(absl::StrCat("bench broadcast: the subscriber ",
                                                DescribeWaitStatus(*child_->Poll()), " before '",
                                                want, "'; its log: ", path_));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("bench broadcast: no '", want, "' from the subscriber in ",
                         absl::FormatDuration(timeout), "; its log: ", path_));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  ChildProcess* child_;
  std::string path_;
  int fd_ = -1;
  std::string pending_;  // read, not yet a whole line
};

struct Timing {
  std::vector<double> publish_to_swapped_ms, publish_ms;
  double normal_step_ms = 0, swap_step_ms = 0;
};

// What one version is: the model's weights, or (adapter set) an adapter of it alone.
struct Published {
  const ParameterSet* weights = nullptr;
  const LoraSet* adapter = nullptr;

  WeightSpec spec() const {
    return adapter != nullptr ? WeightSpec(weights->config, adapter->lora)
                              : WeightSpec(weights->config);
  }
  absl::Status To(WeightPublisher& publisher, int64_t version) const {
    return adapter != nullptr ? publisher.Publish(version, *adapter)
                              : publisher.Publish(version, *weights);
  }
};

absl::StatusOr<Timing> TimeTransport(const std::string& preset, const std::string& transport,
                                     const Published& what, const BroadcastBenchOptions& o,
                                     int index) {
  PRL_ASSIGN_OR_RETURN(const int port, PickFreePort());
  const std::string run_name = absl::StrCat("bench-broadcast-", getpid(), "-", index);
  const std::string listen = absl::StrCat("127.0.0.1:", port);
  const config::RunConfig c = TransportConfig(transport, run_name, listen);
  PRL_ASSIGN_OR_RETURN(roles::WeightEndpoint endpoint,
                       roles::StartWeightPublisher(c, what.spec(), o.device));
  int64_t version = std::max<int64_t>(endpoint.publisher->newest_version(), 0) + 1;
  PRL_RETURN_IF_ERROR(what.To(*endpoint.publisher, version));

  ChildSpec spec;
  spec.name = "subscriber";
  spec.log_path = absl::StrCat(o.work_dir, "/", run_name, ".log");
  std::remove(spec.log_path.c_str());
  spec.argv = {
      o.prl_path,       "bench",
      "broadcast",      "--subscriber",
      "--configs",      preset,
      "--transports",   transport,
      "--device",       o.device.ToString(),
      "--dtype",        std::string(EnumName(kComputeDTypeNames, o.dtype)),
      "--run-name",     run_name,
      "--listen",       listen,
      "--versions",     absl::StrCat(o.versions),
      "--batch",        absl::StrCat(o.batch),
      "--adapter-rank", absl::StrCat(what.adapter != nullptr ? what.adapter->lora.rank : 0)};
  PRL_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Start(spec));
  ChildLines lines(&child, spec.log_path);
  Timing t;
  absl::Status status = [&]() -> absl::Status {
    PRL_RETURN_IF_ERROR(lines.Await("ready", absl::Minutes(3)).status());
    for (int i = 0; i < o.versions; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // steps without a swap
      ++version;
      const int64_t start = MonotonicNs();
      PRL_RETURN_IF_ERROR(what.To(*endpoint.publisher, version));
      t.publish_ms.push_back(static_cast<double>(MonotonicNs() - start) / 1e6);
      std::vector<std::string> w;
      do {
        PRL_ASSIGN_OR_RETURN(w, lines.Await("swapped", absl::Minutes(2)));
      } while (w.size() == 3 && std::stoll(w[1]) < version);
      if (w.size() != 3 || std::stoll(w[1]) != version) {
        return absl::InternalError(absl::StrCat("bench broadcast: expected 'swapped ", version,
                                                " T', got '", absl::StrJoin(w, " "), "'"));
      }
      t.publish_to_swapped_ms.push_back(static_cast<double>(std::stoll(w[2]) - start) / 1e6);
    }
    PRL_ASSIGN_OR_RETURN(std::vector<std::string> steps, lines.Await("steps", absl::Minutes(1)));
    if (steps.size() != 3) return absl::InternalError("bench broadcast: a malformed steps line");
    t.normal_step_ms = std::stod(steps[1]);
    t.swap_step_ms = std::stod(steps[2]);
    return absl::OkStatus();
  }();
  child.Stop(absl::Seconds(5));
  endpoint.publisher.reset();
  roles::RemoveWeightTransportState(c);
  PRL_RETURN_IF_ERROR(status);
  return t;
}

// A batch of long requests; topped up as they finish, so every step decodes `batch` rows.
absl::Status TopUp(Engine& engine, int64_t batch, int64_t vocab, std::mt19937& rng,
                   int64_t* running) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  for (; *running < batch; ++*running) {
    std::vector<int32_t> prompt(kPromptLen);
    for (auto& x : prompt) x = token(rng);
    SamplingParams p;
    p.max_tokens = kMaxTokens;
    p.seed = rng();
    PRL_RETURN_IF_ERROR(engine.AddRequest(std::move(prompt), p).status());
  }
  return absl::OkStatus();
}

}  // namespace

LoraConfig BenchAdapter(int64_t rank) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 2.0 * static_cast<double>(rank);
  l.target_modules = {"all-linear"};
  return l;
}

absl::Status RunBroadcastSubscriber(const BroadcastSubscriberOptions& o) {
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, PresetConfig(o.config));
  const config::RunConfig c = TransportConfig(o.transport, o.run_name, o.listen);
  const bool adapters = o.adapter_rank > 0;
  const WeightSpec spec =
      adapters ? WeightSpec(model, BenchAdapter(o.adapter_rank)) : WeightSpec(model);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<WeightSubscriber> subscriber,
                       roles::OpenWeightSubscriber(c, spec, o.device));
  PRL_ASSIGN_OR_RETURN(VersionedWeights first, subscriber->WaitNewer(-1, absl::Minutes(2)));
  if (adapters) {  // the versions are adapters: the engine runs them on a base of its own
    PRL_ASSIGN_OR_RETURN(ParameterSet base, RandomParameters(model, o.device));
    first.weights = std::make_shared<const ParameterSet>(std::move(base));
  }
  EngineOptions eo;
  eo.device = o.device;
  eo.dtype = o.dtype;
  eo.max_num_seqs = static_cast<int32_t>(o.batch);
  eo.max_model_len = kPromptLen + kMaxTokens;
  eo.kv_cache_bytes = o.batch * ((eo.max_model_len + eo.block_size - 1) / eo.block_size) *
                      KvCache::BytesPerBlock(model, eo.block_size, eo.dtype);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                       Engine::Create(first.weights, first.version, eo));
  if (adapters) PRL_RETURN_IF_ERROR(engine->SetAdapter(first.adapter));
  std::mt19937 rng(7);
  int64_t running = 0, staged = first.version, seen = first.version;
  PRL_RETURN_IF_ERROR(TopUp(*engine, o.batch, model.vocab_size, rng, &running));
  PRL_RETURN_IF_ERROR(engine->Step());  // the prefill, before "ready"
  std::printf("ready %lld\n", static_cast<long long>(first.version));
  std::fflush(stdout);
  std::vector<double> normal_ms, swap_ms;
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  for (int swaps = 0; swaps < o.versions;) {
    if (absl::Now() > deadline) return absl::DeadlineExceededError("subscriber: no new versions");
    PRL_ASSIGN_OR_RETURN(std::optional<VersionedWeights> next, subscriber->TakeNewer(staged));
    if (next.has_value()) {
      PRL_RETURN_IF_ERROR(adapters ? engine->SwapAdapter(next->adapter, next->version)
                                   : engine->SwapWeights(next->weights, next->version));
      staged = next->version;
    }
    PRL_RETURN_IF_ERROR(TopUp(*engine, o.batch, model.vocab_size, rng, &running));
    const int64_t start = MonotonicNs();
    PRL_RETURN_IF_ERROR(engine->Step());
    const int64_t end = MonotonicNs();
    running -= static_cast<int64_t>(engine->TakeFinished().size());
    const int64_t version = engine->Stats().weight_version;
    (version != seen ? swap_ms : normal_ms).push_back(static_cast<double>(end - start) / 1e6);
    if (version != seen) {
      std::printf("swapped %lld %lld\n", static_cast<long long>(version),
                  static_cast<long long>(end));
      std::fflush(stdout);
      seen = version;
      ++swaps;
    }
  }
  double swap_mean = 0;
  for (double x : swap_ms) swap_mean += x / static_cast<double>(swap_ms.size());
  std::printf("steps %.4f %.4f\n", Median(normal_ms), swap_mean);
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::StatusOr<Report> RunBroadcastBench(const BroadcastBenchOptions& o) {
  std::vector<std::string> transports = o.transports;
  if (transports.empty()) {
    transports = {"shm", "grpc"};
    if (o.device.is_cuda()) transports.insert(transports.begin(), "cuda_ipc");
  }
  for (const std::string& t : transports) PRL_RETURN_IF_ERROR(ParseTransport(t).status());
  if (o.versions < 1 || o.versions > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench broadcast: --versions: expected 1 to 1000, found ", o.versions));
  }
  if (o.batch < 1 || o.batch > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench broadcast: --batch: expected 1 to 4096, found ", o.batch));
  }
  if (o.configs.empty()) {
    return absl::InvalidArgumentError("bench broadcast: --configs: expected at least one preset");
  }
  if (o.adapter_rank < 0 || o.adapter_rank > 1024 || (o.adapter_rank > 0 && !o.device.is_cpu())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench broadcast: --adapter-rank: expected 0 (none) or 1 to 1024 on the CPU (adapters "
        "on CUDA engines wait for their GPU verification), found ",
        o.adapter_rank, " on ", o.device.ToString()));
  }
  Report report;
  report.bench = "broadcast";
  report.machine = MachineInfo();
  report.setup = {{"device", o.device.ToString()},
                  {"engine dtype", std::string(EnumName(kComputeDTypeNames, o.dtype))},
                  {"versions", absl::StrCat(o.versions, " per model and transport (medians)")},
                  {"subscriber", absl::StrCat("a second prl process decoding ", o.batch,
                                              " sequences (prompt ", kPromptLen, ")")}};
  int index = 0;
  for (const std::string& preset : o.configs) {
    PRL_ASSIGN_OR_RETURN(const ModelConfig model, PresetConfig(preset));
    PRL_ASSIGN_OR_RETURN(const ParameterSet weights, RandomParameters(model, o.device));
    PRL_ASSIGN_OR_RETURN(const double copy_ms, CopyFloorMs(weights));
    report.setup.push_back(
        {preset, absl::StrFormat("%.1f MiB of fp32 weights",
                                 static_cast<double>(weights.buffer.bytes()) / (1 << 20))});
    for (const std::string& transport : transports) {
      if (o.progress) {
        std::fprintf(stderr, "bench broadcast: %s over %s\n", preset.c_str(), transport.c_str());
      }
      PRL_ASSIGN_OR_RETURN(const Timing t,
                           TimeTransport(preset, transport, Published{&weights}, o, index++));
      const std::string tag = absl::StrCat(preset, "_", transport);
      const double to_swapped = Median(t.publish_to_swapped_ms), publish = Median(t.publish_ms);
      const double stall = std::max(0.0, t.swap_step_ms - t.normal_step_ms);
      report.results.push_back(
          {absl::StrCat("publish_to_swapped_", tag), to_swapped, "ms", "weight_copy", copy_ms});
      report.results.push_back(
          {absl::StrCat("publish_", tag), publish, "ms", "weight_copy", copy_ms});
      report.results.push_back(
          {absl::StrCat("swap_stall_", tag), stall, "ms", "step_without_swap", t.normal_step_ms});
      if (o.adapter_rank == 0) continue;
      // The LoRA learner's versions over the same transport, beside the full model's.
      PRL_ASSIGN_OR_RETURN(LoraSet adapter, LoraSet::Allocate(model, BenchAdapter(o.adapter_rank),
                                                              Device::Cpu(), false));
      InitializeLora(adapter, 3);
      if (o.progress) {
        std::fprintf(stderr, "bench broadcast: %s over %s, LoRA rank %lld alone\n", preset.c_str(),
                     transport.c_str(), static_cast<long long>(o.adapter_rank));
      }
      PRL_ASSIGN_OR_RETURN(
          const Timing a,
          TimeTransport(preset, transport, Published{&weights, &adapter}, o, index++));
      const std::string atag = absl::StrCat(tag, "_lora_r", o.adapter_rank);
      report.results.push_back({absl::StrCat("publish_to_swapped_", atag),
                                Median(a.publish_to_swapped_ms), "ms",
                                absl::StrCat("publish_to_swapped_", tag), to_swapped});
      report.results.push_back({absl::StrCat("publish_", atag), Median(a.publish_ms), "ms",
                                absl::StrCat("publish_", tag), publish});
      report.results.push_back({absl::StrCat("swap_stall_", atag),
                                std::max(0.0, a.swap_step_ms - a.normal_step_ms), "ms",
                                absl::StrCat("swap_stall_", tag), stall});
      report.results.push_back({absl::StrCat("version_bytes_", atag),
                                static_cast<double>(adapter.buffer.bytes()), "bytes",
                                absl::StrCat("version_bytes_", tag),
                                static_cast<double>(weights.buffer.bytes())});
    }
  }
  return report;
}

}  // namespace prl::bench
