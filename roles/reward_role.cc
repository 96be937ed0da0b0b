#include "roles/reward_role.h"

#include <cstdio>
#include <memory>
#include <thread>

#include "core/status_macros.h"
#include "reward/reward_service.h"
#include "roles/role_security.h"

namespace prl::roles {

reward::RewardSpec TaskRewardSpec(const config::RunConfig& c) {
  reward::RewardSpec spec{c.task.reward, c.task.reward_params};
  if (c.task.reward == "arithmetic") {
    spec.params["credit"] = std::string(EnumName(config::kArithmeticCreditNames, c.task.credit));
  }
  return spec;
}

absl::Status RunRewardRole(const config::RunConfig& c, const std::atomic<bool>& stop) {
  PRL_RETURN_IF_ERROR(ConfigureRoleSecurity(c, std::nullopt, {rpc::Role::kService}));
  const reward::RewardSpec spec = TaskRewardSpec(c);
  PRL_ASSIGN_OR_RETURN(std::shared_ptr<reward::RewardFunction> function,
                       reward::MakeRewardFunction(spec));
  reward::RewardServerOptions options;
  options.address = c.reward.listen;
  options.max_message_bytes = c.reward.max_message_mb << 20;
  PRL_ASSIGN_OR_RETURN_IN(
      auto server,
      reward::RewardServer::Start(
          [function](absl::Span<const reward::RewardInput> in) { return function->ScoreBatch(in); },
          options),
      "reward.listen");
  std::printf("reward %s on port %d (RewardService, health, reflection)\n", spec.name.c_str(),
              server->port());
  std::fflush(stdout);
  while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace prl::roles
