// The learner's algorithm choices as the run config names them: the enumerations and their
// spellings (core/enum_names.h). They live below both the config and the learner, so that the
// config, which configures the learner, does not include the learner's headers.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/enum_names.h"

namespace prl::learner {

// Group advantages (learner/advantages.h).
enum class AdvantageEstimator { kGrpo, kDrGrpo };
inline constexpr NamedValue<AdvantageEstimator> kAdvantageEstimatorNames[] = {
    {"grpo", AdvantageEstimator::kGrpo}, {"dr_grpo", AdvantageEstimator::kDrGrpo}};

// The policy loss (learner/losses.h).
enum class LossKind { kReinforceTis, kPpoClip, kDecoupledPpo, kIcepop, kCispo, kGspo, kSft };
inline constexpr NamedValue<LossKind> kLossKindNames[] = {
    {"reinforce_tis", LossKind::kReinforceTis},
    {"ppo_clip", LossKind::kPpoClip},
    {"decoupled_ppo", LossKind::kDecoupledPpo},
    {"icepop", LossKind::kIcepop},
    {"cispo", LossKind::kCispo},
    {"gspo", LossKind::kGspo},
    {"sft", LossKind::kSft}};
// "reinforce_tis", "ppo_clip", ...; an unknown name is an error listing the valid ones.
inline absl::StatusOr<LossKind> ParseLossKind(absl::string_view name) {
  return ParseEnum(kLossKindNames, name, "loss");
}
inline absl::string_view LossKindName(LossKind kind) { return EnumName(kLossKindNames, kind); }

// The loss's denominator: every trained token of the step over all ranks, or the mean per
// sequence.
enum class LossNormalization { kGlobalTokens, kSequenceMean };
inline constexpr NamedValue<LossNormalization> kLossNormalizationNames[] = {
    {"tokens", LossNormalization::kGlobalTokens}, {"sequence", LossNormalization::kSequenceMean}};

// Qwen3-MoE: which experts the learner's forward uses for completion tokens that carry the
// actor's routes (learner/train_step.h). recompute: the learner's router chooses (in the fp32
// CPU and batch-invariant modes the very experts the actor used, bit for bit); replay: the
// recorded ones (prompt tokens are always routed by the router), with gradients through the
// router's probabilities of those experts (model/moe_layer.h). Replay is for modes that cannot
// promise equal routing (bf16 on a GPU).
enum class MoeRouting { kRecompute, kReplay };
inline constexpr NamedValue<MoeRouting> kMoeRoutingNames[] = {{"recompute", MoeRouting::kRecompute},
                                                              {"replay", MoeRouting::kReplay}};

// The KL penalty to a reference model (learner/reference_kl.h): the estimator of KL(pi || ref)
// at a sampled token, d = log pi - log ref (Schulman's k1, k2, k3; k3 is verl's "low_var_kl").
enum class KlEstimator { kK1, kK2, kK3 };
inline constexpr NamedValue<KlEstimator> kKlEstimatorNames[] = {
    {"k1", KlEstimator::kK1}, {"k2", KlEstimator::kK2}, {"k3", KlEstimator::kK3}};
// Where the penalty acts: a term of the loss (with its gradient), or a per-token reward whose
// return is subtracted from the advantage (no gradient through the estimate).
enum class KlPenalty { kLoss, kReward };
inline constexpr NamedValue<KlPenalty> kKlPenaltyNames[] = {{"loss", KlPenalty::kLoss},
                                                            {"reward", KlPenalty::kReward}};

// The optimizer (learner/optimizer.h).
enum class OptimizerKind { kAdamW, kSgd };
inline constexpr NamedValue<OptimizerKind> kOptimizerKindNames[] = {
    {"adamw", OptimizerKind::kAdamW}, {"sgd", OptimizerKind::kSgd}};
inline absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  return ParseEnum(kOptimizerKindNames, name, "optimizer");
}

}  // namespace prl::learner
