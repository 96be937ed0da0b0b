// One rank of a learner group for the multi-process collective tests (multiprocess_test.cc),
// run as its own process so that it can be killed or stopped at any moment.
//
//   collective_worker all     every collective (the exchanges included), every dtype, in-place
//                             variants and a second communicator; prints "OK" and exits 0 when
//                             every value is exact
//   collective_worker quick   connects, checks one all-reduce, prints "OK"
//   collective_worker loop    all-reduces until an error; prints "FIRST <code> <message>" and
//                             "SECOND <code> <ms>" (a later call, which must fail at once), and
//                             exits 3; writes PRL_TEST_READY_DIR/ready.<rank> once running
//
// The group comes from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; PRL_TEST_STORE_DIR selects
// a FileStore, PRL_TEST_TIMEOUT_MS the collective time-out (default 60 s).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collective/rendezvous.h"

namespace prl::collective {
namespace {

int failures = 0;

#define CHECK_OK(expr)                                              \
  do {                                                              \
    const absl::Status s_ = (expr);                                 \
    if (!s_.ok()) {                                                 \
      std::printf("FAILED %s: %s\n", #expr, s_.ToString().c_str()); \
      std::fflush(stdout);                                          \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

template <typename T, typename U>
void ExpectEq(const T& got, const U& want, const std::string& what) {
  if (got != want) {
    if (++failures < 20) {
      std::printf("MISMATCH %s: got %s, want %s\n", what.c_str(), absl::StrCat(got).c_str(),
                  absl::StrCat(want).c_str());
    }
  }
}

Tensor View(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, Device::Cpu(), {static_cast<int64_t>(v.size())});
}

// The random input of `rank` for the float tests: every rank can regenerate every rank's.
std::vector<float> RandomInput(int rank, size_t n, uint32_t salt) {
  std::mt19937 rng(1000 * salt + rank);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// |got - exact| within a few float ulps of the sum of magnitudes.
void ExpectClose(float got, double exact, double magnitude, const std::string& what) {
  const double tolerance = 1e-6 * magnitude + 1e-30;
  if (std::abs(got - exact) > tolerance && ++failures < 20) {
    std::printf("NOT CLOSE %s: got %.9g, float64 sum %.17g\n", what.c_str(), got, exact);
  }
}

void AllGatherChecks(Communicator& c) {
  const int r = c.rank(), w = c.world_size();
  const int64_t n = 5;
  // F32 values.
  std::vector<float> shard(n), out(w * n, -1.0f);
  for (int64_t i = 0; i < n; ++i) shard[i] = r * 100 + i;
  CHECK_OK(c.AllGather(View(shard), View(out)));
  for (int j = 0; j < w; ++j) {
    for (int64_t i = 0; i < n; ++i) ExpectEq(out[j * n + i], j * 100 + i, "all_gather f32");
  }
  // I32 and BF16: bytes travel untouched (a NaN pattern included).
  std::vector<int32_t> ishard(3), iout(3 * w);
  for (int i = 0; i < 3; ++i) ishard[i] = -(r + 1) * 1000003 + i;
  CHECK_OK(c.AllGather(Tensor(ishard.data(), DType::kI32, Device::Cpu(), {3}),
                       Tensor(iout.data(), DType::kI32, Device::Cpu(), {w, 3})));
  for (int j = 0; j < w; ++j) {
    for (int i = 0; i < 3; ++i) ExpectEq(iout[j * 3 + i], -(j + 1) * 1000003 + i, "all_gather i32");
  }
  std::vector<uint16_t> hshard = {static_cast<uint16_t>(0x7fc1 + r), static_cast<uint16_t>(r)};
  std::vector<uint16_t> hout(2 * w);
  CHECK_OK(c.AllGather(Tensor(hshard.data(), DType::kBF16, Device::Cpu(), {2}),
                       Tensor(hout.data(), DType::kBF16, Device::Cpu(), {2 * w})));
  for (int j = 0; j < w; ++j) {
    ExpectEq(hout[2 * j], 0x7fc1 + j, "all_gather bf16 nan");
    ExpectEq(hout[2 * j + 1], j, "all_gather bf16");
  }
  // In place: the shard already sits in its slice of out (FSDP's layout).
  std::vector<float> full(w * n, -1.0f);
  for (int64_t i = 0; i < n; ++i) full[r * n + i] = r * 10 + i;
  CHECK_OK(c.AllGather(View(full).Reshape({w, n}).Rows(r, r + 1).Reshape({n}), View(full)));
  for (int j = 0; j < w; ++j) {
    for (int64_t i = 0; i < n; ++i) ExpectEq(full[j * n + i], j * 10 + i, "all_gather in place");
  }
}

// AllToAll: block j of rank r's input reaches rank j as its block r; SendRecv around the ring:
// rank r's data reaches rank r + 1, twice in a row (the tags of consecutive calls apart).
void ExchangeChecks(Communicator& c) {
  const int r = c.rank(), w = c.world_size();
  const int64_t n = 7;
  std::vector<float> in(w * n), out(w * n, -1.0f);
  for (int j = 0; j < w; ++j) {
    for (int64_t i = 0; i < n; ++i) in[j * n + i] = r * 1000 + j * 10 + i;
  }
  CHECK_OK(c.AllToAll(View(in), View(out)));
  for (int j = 0; j < w; ++j) {
    for (int64_t i = 0; i < n; ++i) ExpectEq(out[j * n + i], j * 1000 + r * 10 + i, "all_to_all");
  }
  const int right = (r + 1) % w, left = (r + w - 1) % w;
  for (int round = 0; round < 2; ++round) {
    std::vector<float> send(1000 + round), recv(1000 + round, -1.0f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = r * 100000 + round * 10000 + i;
    CHECK_OK(c.SendRecv(View(send), right, View(recv), left));
    for (size_t i = 0; i < recv.size(); ++i) {
      ExpectEq(recv[i], left * 100000 + round * 10000 + i, "send_recv");
    }
  }
}

void ReduceScatterChecks(Communicator& c) {
  const int r = c.rank(), w = c.world_size();
  // Small integers: every float sum is exact.
  const int64_t n = 7;
  std::vector<float> in(w * n), shard(n, -1.0f);
  for (int64_t k = 0; k < w * n; ++k) in[k] = (r + 1) * (k + 1);
  CHECK_OK(c.ReduceScatter(View(in), View(shard)));
  for (int64_t i = 0; i < n; ++i) {
    ExpectEq(shard[i], (w * (w + 1) / 2) * (r * n + i + 1), "reduce_scatter exact");
  }
  // Random floats against a float64 sum; n not a multiple of anything.
  const size_t m = 1003;
  std::vector<float> mine = RandomInput(r, w * m, 1), out(m);
  CHECK_OK(c.ReduceScatter(View(mine), View(out)));
  std::vector<std::vector<float>> all;
  for (int q = 0; q < w; ++q) all.push_back(RandomInput(q, w * m, 1));
  for (size_t i = 0; i < m; ++i) {
    double exact = 0, magnitude = 0;
    for (int q = 0; q < w; ++q) {
      exact += all[q][r * m + i];
      magnitude += std::abs(all[q][r * m + i]);
    }
    ExpectClose(out[i], exact, magnitude, absl::StrCat("reduce_scatter random [", i, "]"));
  }
  // Chunks of several 1 MB segments (the last one short), summed as they arrive.
  const size_t big = 300'007;
  std::vector<float> large(w * big), large_out(big, -1.0f);
  for (size_t k = 0; k < large.size(); ++k) large[k] = static_cast<float>((r + 1) * (k % 4099));
  CHECK_OK(c.ReduceScatter(View(large), View(large_out)));
  for (size_t i = 0; i < big; ++i) {
    ExpectEq(large_out[i], (w * (w + 1) / 2) * ((r * big + i) % 4099),
             absl::StrCat("reduce_scatter segmented [", i, "]"));
  }
  // The shard may be this rank's slice of the input (in place).
  for (int64_t k = 0; k < w * n; ++k) in[k] = (r + 1) * (k + 1);
  CHECK_OK(c.ReduceScatter(View(in), View(in).Reshape({w, n}).Rows(r, r + 1).Reshape({n})));
  for (int64_t i = 0; i < n; ++i) {
    ExpectEq(in[r * n + i], (w * (w + 1) / 2) * (r * n + i + 1), "reduce_scatter in place");
  }
}

void AllReduceChecks(Communicator& c) {
  const int r = c.rank(), w = c.world_size();
  const size_t n = 300'000;  // several of Gloo's 1 MB segments
  std::vector<float> data(n);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(r * 7 + i % 1000);
    CHECK_OK(c.AllReduce(View(data), op));
    for (size_t i = 0; i < n; ++i) {
      const float base = static_cast<float>(i % 1000);
      const float want = op == ReduceOp::kSum   ? 7.0f * w * (w - 1) / 2 + w * base
                         : op == ReduceOp::kMax ? 7.0f * (w - 1) + base
                                                : base;
      ExpectEq(data[i], want, absl::StrCat("all_reduce op ", static_cast<int>(op), " [", i, "]"));
    }
  }
  std::vector<float> mine = RandomInput(r, 4096, 2);
  CHECK_OK(c.AllReduce(View(mine), ReduceOp::kSum));
  std::vector<std::vector<float>> all;
  for (int q = 0; q < w; ++q) all.push_back(RandomInput(q, 4096, 2));
  for (size_t i = 0; i < mine.size(); ++i) {
    double exact = 0, magnitude = 0;
    for (int q = 0; q < w; ++q) {
      exact += all[q][i];
      magnitude += std::abs(all[q][i]);
    }
    ExpectClose(mine[i], exact, magnitude, absl::StrCat("all_reduce random [", i, "]"));
  }
}

void BroadcastAndHostChecks(Communicator& c) {
  const int r = c.rank(), w = c.world_size();
  for (int root = 0; root < w; ++root) {
    std::vector<int32_t> data(33);
    for (int i = 0; i < 33; ++i) data[i] = r == root ? root * 1000 + i : -1;
    CHECK_OK(c.Broadcast(Tensor(data.data(), DType::kI32, Device::Cpu(), {33}), root));
    for (int i = 0; i < 33; ++i) ExpectEq(data[i], root * 1000 + i, "broadcast i32");
  }
  // float64 host reductions are exact where float32 would not be.
  std::vector<double> values = {r + 0.5, 1e15 + r, -static_cast<double>(r)};
  CHECK_OK(c.AllReduceHost(absl::MakeSpan(values), ReduceOp::kSum));
  ExpectEq(values[0], w * (w - 1) / 2.0 + 0.5 * w, "all_reduce_host sum 0");
  ExpectEq(values[1], 1e15 * w + w * (w - 1) / 2.0, "all_reduce_host sum 1");
  values = {static_cast<double>(r), -static_cast<double>(r)};
  CHECK_OK(c.AllReduceHost(absl::MakeSpan(values), ReduceOp::kMax));
  ExpectEq(values[0], w - 1.0, "all_reduce_host max 0");
  ExpectEq(values[1], 0.0, "all_reduce_host max 1");
  values = {static_cast<double>(r), -static_cast<double>(r)};
  CHECK_OK(c.AllReduceHost(absl::MakeSpan(values), ReduceOp::kMin));
  ExpectEq(values[0], 0.0, "all_reduce_host min 0");
  ExpectEq(values[1], 1.0 - w, "all_reduce_host min 1");
  std::string bytes = r == w - 1 ? std::string("checkpoint step 42\0!", 20) : std::string(20, 'x');
  CHECK_OK(c.BroadcastHost(absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()),
                           w - 1));
  ExpectEq(bytes, std::string("checkpoint step 42\0!", 20), "broadcast_host");
  // Empty tensors are no-ops on every rank.
  std::vector<float> none;
  CHECK_OK(c.AllReduce(View(none), ReduceOp::kSum));
  CHECK_OK(c.AllGather(View(none), View(none)));
  CHECK_OK(c.Barrier());
}

absl::StatusOr<RendezvousConfig> Config() {
  absl::StatusOr<RendezvousConfig> config = RendezvousFromEnv();
  if (!config.ok()) return config;
  if (const char* dir = std::getenv("PRL_TEST_STORE_DIR")) config->file_store_dir = dir;
  config->timeout = absl::Seconds(60);
  return config;
}

CommunicatorOptions Options() {
  CommunicatorOptions options;
  const char* ms = std::getenv("PRL_TEST_TIMEOUT_MS");
  options.timeout = ms != nullptr ? absl::Milliseconds(std::atoi(ms)) : absl::Seconds(60);
  return options;
}

int Main(const std::string& scenario) {
  absl::StatusOr<RendezvousConfig> config = Config();
  CHECK_OK(config.status());
  absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectGloo(*config, Options());
  CHECK_OK(comm.status());
  Communicator& c = **comm;
  ExpectEq(c.rank(), config->rank, "rank");
  ExpectEq(c.world_size(), config->world_size, "world_size");
  if (scenario == "quick") {
    std::vector<double> v = {1.0};
    CHECK_OK(c.AllReduceHost(absl::MakeSpan(v), ReduceOp::kSum));
    ExpectEq(v[0], static_cast<double>(c.world_size()), "quick all_reduce_host");
  } else if (scenario == "all") {
    AllGatherChecks(c);
    ExchangeChecks(c);
    ReduceScatterChecks(c);
    AllReduceChecks(c);
    BroadcastAndHostChecks(c);
    // A second communicator of the same run: rank 0's store is shared, the keys are apart.
    config->group_name = "second";
    absl::StatusOr<std::unique_ptr<Communicator>> second = ConnectGloo(*config, Options());
    CHECK_OK(second.status());
    std::vector<double> v = {static_cast<double>(c.rank())};
    CHECK_OK((*second)->AllReduceHost(absl::MakeSpan(v), ReduceOp::kSum));
    ExpectEq(v[0], c.world_size() * (c.world_size() - 1) / 2.0, "second communicator");
  } else if (scenario == "loop") {
    std::vector<float> data(1 << 18, 1.0f);
    absl::Status s;
    for (int64_t step = 0; s.ok(); ++step) {
      s = c.AllReduce(View(data), ReduceOp::kMax);
      if (step == 2) {
        std::ofstream(absl::StrCat(std::getenv("PRL_TEST_READY_DIR"), "/ready.", c.rank()))
            << "ready\n";
      }
    }
    std::printf("FIRST %s %s\n", absl::StatusCodeToString(s.code()).c_str(),
                std::string(s.message()).c_str());
    const absl::Time start = absl::Now();
    const absl::Status again = c.AllReduce(View(data), ReduceOp::kSum);
    const absl::Status barrier = c.Barrier();
    std::printf("SECOND %s %lld same=%d\n", absl::StatusCodeToString(again.code()).c_str(),
                static_cast<long long>(absl::ToInt64Milliseconds(absl::Now() - start)),
                again == s && barrier == s ? 1 : 0);
    std::fflush(stdout);
    return 3;
  } else {
    std::printf("unknown scenario '%s'\n", scenario.c_str());
    return 2;
  }
  if (failures > 0) {
    std::printf("%d mismatches\n", failures);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

}  // namespace
}  // namespace prl::collective

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: collective_worker all|quick|loop\n");
    return 2;
  }
  const int rc = prl::collective::Main(argv[1]);
  std::fflush(stdout);
  return rc;
}
