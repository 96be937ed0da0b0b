// ModelRunner: executes one scheduled step on the model (nano-vllm's model_runner).
//
// It packs the step's chunks into one token batch, runs the shared decoder layers
// (model/decoder_layer.h) with paged attention — each layer first writes the step's K/V into
// the cache slots of its block tables, then attends over the cached context — and returns the
// logits of the rows that are sampled. Activations live in an arena that only grows.
// Not thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/arena.h"
#include "inference_engine/kv_cache.h"
#include "inference_engine/scheduler.h"
#include "kernels/reduction_order.h"
#include "model/config.h"
#include "model/decoder_layer.h"
#include "model/parameters.h"

namespace prl {

class ModelRunner {
 public:
  ModelRunner(const ModelConfig& config, Device device, KvCache* cache,
              kernels::ReductionOrder order);

  // Runs `step` with `params`. On success *logits is (R, V): the logits of the last row of
  // every chunk with samples = true, in chunk order (valid until the next Execute).
  absl::Status Execute(const ModelParams& params, const SchedulerOutput& step, Tensor* logits);

 private:
  ModelConfig config_;
  Device device_;
  KvCache* cache_;
  kernels::ReductionOrder order_;
  std::vector<float> inv_freq_;
  Arena arena_;
};

}  // namespace prl
