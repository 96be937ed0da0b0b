// A weight transport participant for the multi-process tests of the collective and cuda_ipc
// transports (collective_process_test.cc, cuda_weight_transport_test.cc), run as its own
// process so that it can be killed (SIGKILL) or stopped (SIGSTOP), and because CUDA IPC only
// maps memory of another process.
//
//   weight_transport_worker collective-subscribe ADDRESS DEVICE MIB LAST READY_FILE OUT_FILE
//   weight_transport_worker cuda-ipc-subscribe SEGMENT DEVICE MIB LAST READY_FILE OUT_FILE
//     subscribes (DEVICE: cpu or cuda:N), creates READY_FILE, then takes every version it can
//     until LAST, checking that versions increase and that every byte is the version's
//     pattern; writes "received R skipped S" to OUT_FILE and exits 0. Exit 3: a torn or wrong
//     version, 4: versions out of order, 2: any other error.
//   weight_transport_worker cuda-ipc-publish SEGMENT DEVICE MIB FIRST LOG
//     publishes FIRST, FIRST + 1, ... from DEVICE until killed (FIRST "resume": above
//     newest_version()), appending each version to LOG once its Publish returned.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/collective_transport.h"
#include "weight_broadcast/cuda_ipc_transport.h"
#include "weight_broadcast/versioning.h"

namespace {

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "weight_transport_worker: %s\n", message.c_str());
  return code;
}

// `set`'s pattern check, through a host copy when it lives on a GPU.
std::string CheckOnHost(const prl::ParameterSet& set, int64_t version) {
  if (set.buffer.device().is_cpu()) return prl::testing::CheckPattern(set, version);
  auto host = prl::ParameterSet::Allocate(set.config, prl::Device::Cpu(), /*zeroed=*/false);
  if (!host.ok()) return host.status().ToString();
  const absl::Status copied = prl::CopyBytes(host->data(), prl::Device::Cpu(), set.data(),
                                             set.buffer.device(), set.buffer.bytes());
  if (!copied.ok()) return copied.ToString();
  return prl::testing::CheckPattern(*host, version);
}

int Receive(prl::WeightSubscriber& subscriber, int64_t last, const std::string& ready,
            const std::string& out) {
  if (int fd = open(ready.c_str(), O_WRONLY | O_CREAT, 0644); fd >= 0) close(fd);
  int64_t have = -1;
  while (have < last) {
    auto next = subscriber.WaitNewer(have, absl::Seconds(120));
    if (!next.ok()) return Fail(2, next.status().ToString());
    if (next->version <= have) {
      return Fail(4, absl::StrCat("got version ", next->version, " after ", have));
    }
    const std::string bad = CheckOnHost(*next->weights, next->version);
    if (!bad.empty()) return Fail(3, bad);
    have = next->version;
  }
  const prl::SubscriberStats s = subscriber.stats();
  std::ofstream(out) << "received " << s.versions_received << " skipped " << s.versions_skipped
                     << "\n";
  return 0;
}

int Subscribe(const std::string& mode, const std::string& where, prl::Device device, int64_t mib,
              int64_t last, const std::string& ready, const std::string& out) {
  const prl::ModelConfig config = prl::testing::ModelOfMiB(mib);
  if (mode == "collective-subscribe") {
    prl::CollectiveSubscriberOptions options;
    options.device = device;
    options.timeout = absl::Seconds(20);
    options.heartbeat_interval = absl::Milliseconds(100);
    auto subscriber = prl::CollectiveWeightSubscriber::Connect(where, config, options);
    if (!subscriber.ok()) return Fail(2, subscriber.status().ToString());
    return Receive(**subscriber, last, ready, out);
  }
  prl::CudaIpcSubscriberOptions options;
  options.device = device;
  options.open_timeout = absl::Seconds(20);
  auto subscriber = prl::CudaIpcWeightSubscriber::Open(where, config, options);
  if (!subscriber.ok()) return Fail(2, subscriber.status().ToString());
  return Receive(**subscriber, last, ready, out);
}

int Publish(const std::string& segment, prl::Device device, int64_t mib, const std::string& first,
            const std::string& log) {
  const prl::ModelConfig config = prl::testing::ModelOfMiB(mib);
  prl::CudaIpcPublisherOptions options;
  options.device = device;
  auto publisher = prl::CudaIpcWeightPublisher::Create(segment, config, options);
  if (!publisher.ok()) return Fail(2, publisher.status().ToString());
  auto host = prl::ParameterSet::Allocate(config, prl::Device::Cpu(), /*zeroed=*/false);
  auto weights = prl::ParameterSet::Allocate(config, device, /*zeroed=*/false);
  if (!host.ok() || !weights.ok()) return Fail(2, "cannot allocate the weights");
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  int64_t version = first == "resume"
                        ? prl::FirstVersionToPublish(0, (*publisher)->newest_version())
                        : std::atoll(first.c_str());
  for (;; ++version) {
    prl::testing::FillPattern(*host, version);
    absl::Status s = prl::CopyBytes(weights->data(), device, host->data(), prl::Device::Cpu(),
                                    host->buffer.bytes());
    if (s.ok()) s = (*publisher)->Publish(version, *weights);
    if (!s.ok()) return Fail(2, s.ToString());
    const std::string line = absl::StrCat(version, "\n");
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return Fail(2, "cannot write the log");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  absl::StatusOr<prl::Device> device =
      argc > 3 ? prl::ResolveDevice(argv[3]) : absl::InvalidArgumentError("no device");
  if (!device.ok()) return Fail(1, device.status().ToString());
  if (argc == 8 && (mode == "collective-subscribe" || mode == "cuda-ipc-subscribe")) {
    return Subscribe(mode, argv[2], *device, std::atoll(argv[4]), std::atoll(argv[5]), argv[6],
                     argv[7]);
  }
  if (argc == 7 && mode == "cuda-ipc-publish") {
    return Publish(argv[2], *device, std::atoll(argv[4]), argv[5], argv[6]);
  }
  return Fail(1,
              "usage: collective-subscribe ADDRESS DEVICE MIB LAST READY OUT | "
              "cuda-ipc-subscribe SEGMENT DEVICE MIB LAST READY OUT | "
              "cuda-ipc-publish SEGMENT DEVICE MIB FIRST LOG");
}
