// Rendezvous: how the ranks of a learner group find each other, and the communicators built
// on it.
//
// Ranks are described by the PyTorchJob / torchrun convention: RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT. Rank 0 serves a small key-value store over gRPC (prl.v1.StoreService,
// collective/kv_store.h) on MASTER_ADDR:MASTER_PORT; the others connect to it. Gloo exchanges
// its TCP addresses through it and NCCL its unique id. A FileStore (a shared directory)
// replaces the TCP store for single-machine runs.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collective/communicator.h"

namespace prl::collective {

class KvStore;

struct RendezvousConfig {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Non-empty: use a FileStore in this directory instead of the TCP store.
  std::string file_store_dir;
  // How long to wait for all ranks to arrive.
  absl::Duration timeout = absl::Minutes(5);
  // Distinguishes communicators created one after another in the same run (key prefix).
  std::string group_name = "default";
};

// Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Missing or malformed variables are
// errors naming the variable, what was expected and what was found.
absl::StatusOr<RendezvousConfig> RendezvousFromEnv();
// Checks 0 <= rank < world_size, a usable port, a non-empty address.
absl::Status ValidateRendezvous(const RendezvousConfig& config);
// What a group needs whatever its store: 0 <= rank < world_size, a positive timeout, a group
// name (ValidateRendezvous checks this too).
absl::Status ValidateGroup(const RendezvousConfig& config);
// The local address the other ranks can reach this one at: 127.0.0.1 when `master_addr` is a
// loopback address, otherwise the address of the interface that routes to it (a UDP connect
// sends nothing; it only picks the route). Unavailable if it cannot be resolved or reached.
absl::StatusOr<std::string> LocalAddressFacing(const std::string& master_addr);

// A Gloo communicator over TCP (loopback or the host's interface that reaches MASTER_ADDR).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(const RendezvousConfig& rendezvous,
                                                          const CommunicatorOptions& options);
// An NCCL communicator on `device` (a CUDA device). Unimplemented in builds without CUDA;
// FailedPrecondition where no GPU is present.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(const RendezvousConfig& rendezvous,
                                                          Device device,
                                                          const CommunicatorOptions& options);
// True when this binary has the NCCL backend (a CUDA build that found NCCL).
bool NcclCompiled();

// The same, meeting the other ranks through `store` (which the caller serves or reaches: a
// service that runs its own StoreServer forms groups on it, one group_name per group) instead
// of the store rendezvous.master_port / file_store_dir would open; master_port and
// file_store_dir are ignored. Gloo still listens on the interface that reaches master_addr
// (loopback for a loopback address).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGlooThrough(
    std::shared_ptr<KvStore> store, const RendezvousConfig& rendezvous,
    const CommunicatorOptions& options);
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNcclThrough(
    std::shared_ptr<KvStore> store, const RendezvousConfig& rendezvous, Device device,
    const CommunicatorOptions& options);

}  // namespace prl::collective
