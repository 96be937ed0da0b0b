#include "bench/replay_bench.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/child_process.h"
#include "core/status_macros.h"
#include "replay/replay_buffer.h"

namespace prl::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A single record whose encoding is about `bytes` long.
RolloutRecord RecordOfSize(int64_t bytes, int writer, int64_t seq) {
  RolloutRecord r;
  r.run_id = "bench";
  r.prompt_set_id = absl::StrCat("w", writer);
  r.prompt_index = static_cast<uint64_t>(seq);
  r.group_id = static_cast<uint64_t>(seq);
  r.prompt_tokens = {1, 2, 3, 4};
  // 16 bytes per completion token: id, log-prob, version.
  const int64_t tokens = std::max<int64_t>(1, (bytes - 200) / 16);
  r.completion_tokens.assign(tokens, 7);
  r.behaviour_logprobs.assign(tokens, -1.0f);
  r.token_versions.assign(tokens, 0);
  return r;
}

// What a write must at least do: copy a record into a ring as large as the segment (so the
// destination streams through memory, as the replay ring's does), one thread.
double MemcpyGBps(int64_t record_bytes, int64_t ring_bytes) {
  const size_t rec = static_cast<size_t>(record_bytes);
  const size_t slots = std::max<size_t>(1, static_cast<size_t>(ring_bytes) / rec);
  std::vector<char> src(rec, 1), ring(slots * rec, 2);
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = Clock::now();
    for (size_t i = 0; i < slots; ++i) std::memcpy(ring.data() + i * rec, src.data(), rec);
    best = std::max(best, static_cast<double>(slots * rec) / Seconds(start) / 1e9);
  }
  return best;
}

// A writer process's body (ChildProcess::Fork): its exit code.
int WriterMain(const std::string& segment, int writer, int64_t first, int64_t count,
               int64_t bytes, std::atomic<int>* ready, std::atomic<int>* go) {
  auto buffer = ReplayBuffer::Open(segment);
  if (!buffer.ok()) return 2;
  RolloutRecord record = RecordOfSize(bytes, writer, 0);
  ready->fetch_add(1);
  while (go->load() == 0) {
  }
  for (int64_t seq = first; seq < first + count; ++seq) {
    record.prompt_index = record.group_id = static_cast<uint64_t>(seq);
    if (!(*buffer)->WriteGroup({&record, 1}, absl::Seconds(60)).ok()) return 3;
  }
  return 0;
}

// A reader process's body: takes, verifies in place and acknowledges until all are consumed.
int ReaderMain(const std::string& segment, int64_t total, std::atomic<int>* ready,
               std::atomic<int>* go, std::atomic<int64_t>* consumed) {
  auto buffer = ReplayBuffer::Open(segment);
  if (!buffer.ok()) return 2;
  ready->fetch_add(1);
  while (go->load() == 0) {
  }
  TakeOptions take;
  take.max_groups = 16;
  take.timeout = absl::Milliseconds(20);
  while (consumed->load() < total) {
    auto groups = (*buffer)->Take(take);
    if (!groups.ok()) return 4;
    for (const LeasedGroup& g : *groups) {
      if (!g.VerifyChecksum()) return 5;
      if (!(*buffer)->Ack(g).ok()) return 6;
      consumed->fetch_add(1);
    }
  }
  return 0;
}

struct Measurement {
  double records_per_s, gb_per_s;
};

absl::StatusOr<Measurement> Measure(const ReplayBenchOptions& o, int64_t bytes, int writers) {
  const std::string segment = absl::StrCat("prl-bench-replay-", getpid());
  ReplayBuffer::Remove(segment, true).IgnoreError();
  ReplayConfig config;
  config.capacity_bytes = std::max(o.capacity_bytes, 8 * bytes);
  PRL_ASSIGN_OR_RETURN(auto buffer, ReplayBuffer::Create(segment, config));
  const int64_t total = std::max<int64_t>(writers, o.bytes_per_run / bytes);
  // Start barrier and progress counters, shared with the children.
  auto* shared = static_cast<std::atomic<int64_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* ready = reinterpret_cast<std::atomic<int>*>(shared);
  auto* go = reinterpret_cast<std::atomic<int>*>(shared + 1);
  auto* consumed = shared + 2;
  new (ready) std::atomic<int>(0);
  new (go) std::atomic<int>(0);
  new (consumed) std::atomic<int64_t>(0);
  std::vector<ChildProcess> children;
  bool failed = false;
  for (int w = 0; w < writers && !failed; ++w) {
    const int64_t first = total * w / writers, count = total * (w + 1) / writers - first;
    absl::StatusOr<ChildProcess> child = ChildProcess::Fork(absl::StrCat("writer-", w), [&] {
      return WriterMain(segment, w, first, count, bytes, ready, go);
    });
    failed = !child.ok();
    if (child.ok()) children.push_back(std::move(*child));
  }
  for (int r = 0; r < o.readers && !failed; ++r) {
    absl::StatusOr<ChildProcess> child = ChildProcess::Fork(
        absl::StrCat("reader-", r), [&] { return ReaderMain(segment, total, ready, go, consumed); });
    failed = !child.ok();
    if (child.ok()) children.push_back(std::move(*child));
  }
  // Every child counts itself ready, or exits early (failed: the rest are killed below).
  const auto all_ready = [&] {
    if (ready->load() >= writers + o.readers) return true;
    for (ChildProcess& c : children) failed |= !c.running();
    return failed;
  };
  while (!all_ready()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  const auto start = Clock::now();
  go->store(1);
  // Every child to its end; the first that fails stops the others (readers would wait
  // forever for groups a dead writer never wrote).
  for (size_t exited = 0; exited < children.size() && !failed;) {
    exited = 0;
    for (ChildProcess& c : children) {
      const std::optional<int> status = c.Poll();
      if (!status.has_value()) continue;
      ++exited;
      failed |= !WIFEXITED(*status) || WEXITSTATUS(*status) != 0;
    }
    if (exited < children.size()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (ChildProcess& c : children) {
    if (c.running()) c.Stop(absl::ZeroDuration());
  }
  const double seconds = Seconds(start);
  const int64_t payload = buffer->Stats().bytes_out;
  munmap(shared, 4096);
  buffer.reset();
  ReplayBuffer::Remove(segment, true).IgnoreError();
  if (failed) return absl::InternalError("bench replay: a writer or reader process failed");
  return Measurement{total / seconds, payload / seconds / 1e9};
}

std::string SizeName(int64_t bytes) {
  return bytes >= (1 << 20) ? absl::StrCat(bytes >> 20, "MB") : absl::StrCat(bytes >> 10, "KB");
}

}  // namespace

absl::StatusOr<Report> RunReplayBench(const ReplayBenchOptions& o) {
  Report report;
  report.bench = "replay";
  report.machine = MachineInfo();
  const int64_t ring = o.capacity_bytes;
  report.setup = {
      {"processes", absl::StrFormat("writers %s, %d readers (separate processes)",
                                    o.writers.size() == 2 ? "1 and 4" : "as given", o.readers)},
      {"readers", "verify each record's checksum in place (zero-copy), then ack"},
      {"volume", absl::StrFormat("%d MB of payload per measurement", o.bytes_per_run >> 20)},
      {"baseline", absl::StrFormat("memcpy of records of the same size into a %d MB ring, one "
                                   "thread (what a write must at least do), best of the runs "
                                   "just before and just after each measurement",
                                   ring >> 20)}};
  for (int64_t bytes : o.record_bytes) {
    for (int writers : o.writers) {
      // The baseline is taken right before and right after the measurement, and the better of
      // the two kept: the machine is shared, and a slow moment must not flatter the ratio.
      const double before = MemcpyGBps(bytes, std::max(ring, 8 * bytes));
      PRL_ASSIGN_OR_RETURN(const Measurement m, Measure(o, bytes, writers));
      const double memcpy_gbps = std::max(before, MemcpyGBps(bytes, std::max(ring, 8 * bytes)));
      const std::string name = absl::StrCat(SizeName(bytes), "_w", writers, "_r", o.readers);
      if (o.progress) {
        std::fprintf(stderr, "bench replay: %s: %.0f records/s, %.2f GB/s\n", name.c_str(),
                     m.records_per_s, m.gb_per_s);
      }
      report.results.push_back({name + "_records", m.records_per_s, "records/s", "", 0.0});
      report.results.push_back({name + "_bandwidth", m.gb_per_s, "GB/s", "memcpy", memcpy_gbps});
    }
  }
  return report;
}

}  // namespace prl::bench
