// ConnectNccl in builds without NCCL (see collective/nccl_communicator.h).
#include "absl/status/status.h"
#include "collective/rendezvous.h"

namespace prl::collective {

bool NcclCompiled() { return false; }

namespace {
absl::Status NcclUnavailable() {
#ifdef PRL_WITH_CUDA
  return absl::UnimplementedError(
      "prl was built with CUDA but without NCCL (nccl.h or libnccl was not found when "
      "configuring; set NCCL_ROOT): NCCL is unavailable");
#else
  return absl::UnimplementedError(
      "prl was built without CUDA (PRL_CUDA=OFF or no toolkit): NCCL is unavailable");
#endif
}
}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(const RendezvousConfig&, Device,
                                                          const CommunicatorOptions&) {
  return NcclUnavailable();
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNcclThrough(std::shared_ptr<KvStore>,
                                                                 const RendezvousConfig&, Device,
                                                                 const CommunicatorOptions&) {
  return NcclUnavailable();
}

}  // namespace prl::collective
