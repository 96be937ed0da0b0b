// An adapter merged into its base (peft's merge_and_unload): W' = W + scale B A on every
// targeted projection, so that the merged model alone computes what the base with the adapter
// computes, up to fp32 rounding. The LoRA learner publishes its policy to the actors this way
// (learner/learner_service.h) until the actors take adapters from the weight broadcast.
#pragma once

#include "model/config.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace prl {

// Adds scale B A into `params`' weights in place (F32, CPU; `adapter` fits `config`, see
// ValidateLoraParams). Each element's delta is summed over the rank in float64.
void MergeLora(const LoraParams& adapter, const ModelConfig& config, const ModelParams& params);

}  // namespace prl
