// Policy-gradient losses with importance correction, per trained token.
//
// Notation (per trained token t of sequence i): pi_t the learner's log-prob at the current
// weights (the only input with a gradient), mu_t the actor's behaviour log-prob, prox_t the
// proximal log-prob the learner recomputed at the start of the step (decoupled_ppo), A_i the
// sequence's advantage, sg() stop-gradient, r_t = exp(pi_t - mu_t).
// The formula of every loss is written beside its implementation in losses.cc.
//
// Normalisation: a micro-batch's loss is its sum of per-token losses divided by the number of
// trained tokens in the WHOLE step (all micro-batches, all ranks: LossNormalizer), so that the
// step's gradient does not depend on how the batch was split. kSequenceMean instead divides
// each sequence's sum by its own length and the total by the step's number of sequences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "config/learner_kinds.h"
#include "core/enum_names.h"
#include "learner/reference_kl.h"

namespace prl::learner {

struct LossConfig {
  LossKind kind = LossKind::kReinforceTis;
  LossNormalization normalization = LossNormalization::kGlobalTokens;
  double tis_cap = 2.0;   // c: reinforce_tis weight and decoupled_ppo behaviour weight cap
  double clip_low = 0.2;  // ppo_clip / decoupled_ppo: ratio clipped to [1 - low, 1 + high]
  double clip_high = 0.2;
  double icepop_low = 0.5;  // icepop: tokens with r outside [low, high] are masked
  double icepop_high = 2.0;
  double cispo_clip_low = 1.0;  // cispo: sg(clip(r, 1 - low, 1 + high)); low = 1: no lower bound
  double cispo_clip_high = 0.28;
  double gspo_clip_low = 3e-4;  // gspo: sequence ratio clipped to [1 - low, 1 + high]
  double gspo_clip_high = 4e-4;
  KlConfig kl;  // the penalty to a reference model (learner/reference_kl.h); off by default
};
// Every field in range (caps > 0, 0 <= low, low < 1 where a lower bound 1 - low must stay
// > 0, icepop_low < icepop_high); errors name the field, expected and found value.
absl::Status ValidateLossConfig(const LossConfig& config);

// One micro-batch's trained tokens, packed sequence after sequence.
struct LossInputs {
  absl::Span<const float> pi;          // (N) learner log-probs
  absl::Span<const float> mu;          // (N) behaviour log-probs; sft: empty or (N), see below
  absl::Span<const float> prox;        // (N) proximal log-probs; decoupled_ppo only, else ignored
  absl::Span<const float> advantages;  // (N) the sequence's advantage on each token; sft: unused
  absl::Span<const int32_t> seq_offsets;  // (S + 1) sequence s is tokens [off[s], off[s + 1])
  absl::Span<const float> ref;  // (N) the reference model's log-probs; with kl enabled only
  // (S) each sequence's trained tokens in the whole sequence, where this input holds a share of
  // them (context parallelism: learner/train_step.h); empty: the tokens given here. The
  // sequence-mean normalization divides by it.
  absl::Span<const int32_t> seq_trained_tokens;
  // (S) with seq_trained_tokens: each whole sequence's sum of pi - mu over its trained tokens
  // (gspo's sequence ratio); empty: this input's.
  absl::Span<const double> seq_log_ratio_sums;
  // (N) kl_penalty reward over a context group's shares: each token's penalty sum over the
  // later trained tokens of its sequence that other ranks hold (its return to go adds it);
  // empty: none.
  absl::Span<const double> penalty_after;
};

// Totals over the whole step (all micro-batches, all ranks), known before any backward.
struct LossNormalizer {
  double tokens = 0;     // trained tokens
  double sequences = 0;  // sequences with at least one trained token
};

// Sums over tokens (and sequences) that merge across micro-batches and ranks by addition
// (ratio_max by max): ToVector / FromVector feed Communicator::AllReduceHost.
struct LossStats {
  double loss = 0;  // the normalised loss (sum of micro-batch contributions)
  double tokens = 0;
  double sequences = 0;
  double ratio_sum = 0;        // sum of r_t
  double ratio_max = 0;        // max of r_t
  double clipped = 0;          // tokens whose gradient was clipped, truncated or masked
  double weight_sum = 0;       // sum of the importance weights w_t actually applied
  double weight_sq_sum = 0;    // sum of w_t^2
  double kl_sum = 0;           // sum of k3 = (r - 1) - log r: KL(mu || pi) estimate
  double neg_logprob_sum = 0;  // sum of -pi_t: entropy estimate from sampled tokens
  double ref_kl_sum = 0;       // sum of the kl estimator at (pi_t, ref_t); with kl enabled

  void Merge(const LossStats& other);
  // The kNumSums summed fields, then ratio_max last: all-reduce the first kNumSums values with
  // kSum and the last one with kMax. FromVector needs kNumSums + 1 values.
  static constexpr size_t kNumSums = 10;
  std::vector<double> ToVector() const;
  static LossStats FromVector(absl::Span<const double> values);
  // Derived figures for reports.
  double mean_ratio() const;
  double clipped_fraction() const;
  double effective_sample_size() const;  // (sum w)^2 / (N sum w^2), in (0, 1]; 0 if all w = 0
  double kl() const;                     // mean k3
  double entropy() const;                // mean -pi
  double reference_kl() const;           // mean kl estimate to the reference (0: kl off)
};

// Adds this micro-batch's normalised loss to stats->loss (and its sums to the other fields)
// and writes dloss/dpi_t to dpi (N). Inputs must agree in size (errors name the span), offsets
// must run from 0 to N without decreasing, every used input must be finite (errors name the
// token), and the normalizer's active count must be > 0 and cover this micro-batch. On error
// neither dpi nor stats is touched. sft applies weight 1 and reports ratio and kl only when mu
// is given (they stay 0 otherwise). gspo needs one advantage per sequence (errors name it).
// With config.kl enabled, ref must have one finite value per token (and kl reward, mu too).
absl::Status ComputeLoss(const LossConfig& config, const LossInputs& inputs,
                         const LossNormalizer& normalizer, absl::Span<float> dpi, LossStats* stats);

}  // namespace prl::learner
