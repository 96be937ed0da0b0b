// A shared-memory weight transport participant for the multi-process tests
// (shm_process_test.cc), run as its own process so that it can be killed with SIGKILL.
//
//   weight_shm_worker subscribe SEGMENT MIB LAST_VERSION READY_FILE
//     opens a subscriber, creates READY_FILE, then takes every version it can until
//     LAST_VERSION, checking that versions increase and that every byte is the version's
//     pattern. Prints "received N retries R" and exits 0; 3: a torn or wrong version,
//     4: versions out of order, 2: any other error.
//   weight_shm_worker publish SEGMENT MIB FIRST_VERSION LOG
//     publishes FIRST_VERSION, FIRST_VERSION + 1, ... until killed, appending each version to
//     LOG once its Publish returned.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/shm_transport.h"

namespace {

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "weight_shm_worker: %s\n", message.c_str());
  return code;
}

int Subscribe(const std::string& segment, int64_t mib, int64_t last, const std::string& ready) {
  prl::ShmSubscriberOptions options;
  options.open_timeout = absl::Seconds(20);
  auto subscriber = prl::ShmWeightSubscriber::Open(segment, prl::testing::ModelOfMiB(mib), options);
  if (!subscriber.ok()) return Fail(2, subscriber.status().ToString());
  if (int fd = open(ready.c_str(), O_WRONLY | O_CREAT, 0644); fd >= 0) close(fd);
  int64_t have = -1, received = 0;
  while (have < last) {
    auto next = (*subscriber)->WaitNewer(have, absl::Seconds(60));
    if (!next.ok()) return Fail(2, next.status().ToString());
    if (next->version <= have) {
      return Fail(4, absl::StrCat("got version ", next->version, " after ", have));
    }
    const std::string bad = prl::testing::CheckPattern(*next->weights, next->version);
    if (!bad.empty()) return Fail(3, bad);
    have = next->version;
    ++received;
  }
  std::printf("received %lld retries %lld\n", static_cast<long long>(received),
              static_cast<long long>((*subscriber)->stats().retries));
  return 0;
}

int Publish(const std::string& segment, int64_t mib, int64_t first, const std::string& log) {
  const prl::ModelConfig config = prl::testing::ModelOfMiB(mib);
  auto publisher = prl::ShmWeightPublisher::Create(segment, config);
  if (!publisher.ok()) return Fail(2, publisher.status().ToString());
  auto weights = prl::ParameterSet::Allocate(config, prl::Device::Cpu(), /*zeroed=*/false);
  if (!weights.ok()) return Fail(2, weights.status().ToString());
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  for (int64_t version = first;; ++version) {
    prl::testing::FillPattern(*weights, version);
    const absl::Status published = (*publisher)->Publish(version, *weights);
    if (!published.ok()) return Fail(2, published.ToString());
    const std::string line = absl::StrCat(version, "\n");
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return Fail(2, "cannot write the log");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "subscribe") {
    return Subscribe(argv[2], std::atoll(argv[3]), std::atoll(argv[4]), argv[5]);
  }
  if (argc == 6 && std::string(argv[1]) == "publish") {
    return Publish(argv[2], std::atoll(argv[3]), std::atoll(argv[4]), argv[5]);
  }
  return Fail(1, "usage: subscribe SEGMENT MIB LAST READY | publish SEGMENT MIB FIRST LOG");
}
