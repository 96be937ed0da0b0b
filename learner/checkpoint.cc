#include "learner/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/safetensors.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"

namespace prl::learner {

namespace fs = std::filesystem;

namespace {

std::string StepName(int64_t step) { return absl::StrFormat("step-%08d", step); }
std::string RankFile(int rank, int world) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world);
}

// What must match for a shard to be loadable here.
std::string ModelFingerprint(const ModelConfig& c) {
  return absl::StrCat(ArchitectureName(c.arch), " hidden=", c.hidden_size,
                      " layers=", c.num_hidden_layers, " heads=", c.num_attention_heads, "/",
                      c.num_key_value_heads, " head_dim=", c.head_dim,
                      " intermediate=", c.intermediate_size, " vocab=", c.vocab_size,
                      " tied=", c.tie_word_embeddings, " qkv_bias=", c.qkv_bias);
}

absl::StatusOr<std::string> ReadLatest(const std::string& dir) {
  const std::string path = dir + "/latest";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  std::string name;
  std::getline(in, name);
  if (name.empty() || !fs::is_directory(dir + "/" + name)) {
    return absl::DataLossError(
        absl::StrCat(path, " names '", name, "', which is not a checkpoint directory"));
  }
  return dir + "/" + name;
}

std::map<std::string, std::string> Metadata(const SafetensorsFile& file) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : file.header().metadata) m[k] = v;
  return m;
}

absl::StatusOr<int64_t> IntField(const std::map<std::string, std::string>& m,
                                 const std::string& key, const std::string& path) {
  auto it = m.find(key);
  int64_t value = 0;
  if (it == m.end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::DataLossError(
        absl::StrCat(path, ": metadata '", key, "' missing or not an integer"));
  }
  return value;
}

absl::StatusOr<TrainingState> StateFrom(const std::map<std::string, std::string>& m,
                                        const std::string& path) {
  TrainingState s;
  PRL_ASSIGN_OR_RETURN(s.step, IntField(m, "step", path));
  PRL_ASSIGN_OR_RETURN(s.weight_version, IntField(m, "weight_version", path));
  PRL_ASSIGN_OR_RETURN(s.data_position, IntField(m, "data_position", path));
  auto u64 = [&](const std::string& key, uint64_t* out) -> absl::Status {
    auto it = m.find(key);
    if (it == m.end() || !absl::SimpleAtoi(it->second, out)) {
      return absl::DataLossError(absl::StrCat(path, ": metadata '", key, "' missing"));
    }
    return absl::OkStatus();
  };
  PRL_RETURN_IF_ERROR(u64("rng_seed", &s.rng_seed));
  PRL_RETURN_IF_ERROR(u64("rng_counter", &s.rng_counter));
  return s;
}

absl::Status Expect(const std::map<std::string, std::string>& m, const std::string& key,
                    const std::string& expected, const std::string& path) {
  auto it = m.find(key);
  const std::string found = it == m.end() ? "(missing)" : it->second;
  if (found != expected) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": checkpoint ", key, " is '", found, "', this run has '", expected, "'",
        key == "world_size" ? " (resharding is not supported: prl export, then restart from the "
                              "exported model)"
                            : ""));
  }
  return absl::OkStatus();
}

absl::Status CopyTensor(const SafetensorsFile& file, const std::string& name,
                        absl::Span<float> out) {
  const SafetensorsEntry* e = file.header().Find(name);
  if (e == nullptr || e->dtype != "F32" || e->numel() != static_cast<int64_t>(out.size())) {
    return absl::DataLossError(absl::StrCat(file.path(), ": tensor '", name, "' must be F32 with ",
                                            out.size(), " elements"));
  }
  const absl::Span<const uint8_t> data = file.Data(*e);
  std::memcpy(out.data(), data.data(), data.size());
  return absl::OkStatus();
}

// The world size a step directory was written with, from its shard names (0: none).
int WorldSizeOf(const std::string& step_dir) {
  int world = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(step_dir, ec)) {
    int r = 0, w = 0;
    if (std::sscanf(entry.path().filename().c_str(), "rank-%d-of-%d.safetensors", &r, &w) == 2) {
      world = w;
    }
  }
  return world;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir, FsdpModel& model, ShardedOptimizer& optimizer,
                            const TrainingState& state, int keep_last) {
  const int rank = model.rank(), world = model.world_size();
  const std::string final_dir = dir + "/" + StepName(state.step);
  const std::string partial = final_dir + ".partial";
  std::error_code ec;
  if (rank == 0) {
    fs::create_directories(dir, ec);
    fs::remove_all(partial, ec);
    if (!fs::create_directories(partial, ec) && ec) {
      return absl::InternalError(absl::StrCat("cannot create ", partial, ": ", ec.message()));
    }
  }
  PRL_RETURN_IF_ERROR(model.RunCollective([](collective::Communicator& c) { return c.Barrier(); }));

  const absl::Span<float> params = model.param_shard();
  const int64_t n = static_cast<int64_t>(params.size());
  std::vector<SafetensorsTensorToWrite> tensors = {{"param_shard", {n}, params.data()}};
  if (optimizer.config().kind == OptimizerKind::kAdamW) {
    tensors.push_back({"exp_avg", {n}, optimizer.exp_avg().data()});
    tensors.push_back({"exp_avg_sq", {n}, optimizer.exp_avg_sq().data()});
  }
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "prl-learner-shard-1"},
      {"model", ModelFingerprint(model.config())},
      {"world_size", absl::StrCat(world)},
      {"rank", absl::StrCat(rank)},
      {"optimizer", optimizer.config().kind == OptimizerKind::kAdamW ? "adamw" : "sgd"},
      {"optimizer_step", absl::StrCat(optimizer.step())},
      {"step", absl::StrCat(state.step)},
      {"weight_version", absl::StrCat(state.weight_version)},
      {"data_position", absl::StrCat(state.data_position)},
      {"rng_seed", absl::StrCat(state.rng_seed)},
      {"rng_counter", absl::StrCat(state.rng_counter)}};
  const absl::Status wrote =
      WriteSafetensors(partial + "/" + RankFile(rank, world), tensors, DType::kF32, metadata);
  // Agree on success before publishing: a rank that failed must not leave a half checkpoint
  // named by `latest`.
  double failed = wrote.ok() ? 0 : 1;
  PRL_RETURN_IF_ERROR(model.RunCollective([&](collective::Communicator& c) {
    return c.AllReduceHost({&failed, 1}, collective::ReduceOp::kMax);
  }));
  PRL_RETURN_IF_ERROR(wrote);
  if (failed > 0) return absl::AbortedError("checkpoint: another rank failed to write its shard");
  if (rank == 0) {
    // The model's config.json beside the shards, so that `prl export` needs nothing else.
    PRL_RETURN_IF_ERROR(
        WriteFileAtomically(partial + "/config.json", ModelConfigToJson(model.config())));
    fs::remove_all(final_dir, ec);
    fs::rename(partial, final_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot rename ", partial, ": ", ec.message()));
    PRL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/latest", StepName(state.step) + "\n"));
    // Keep the newest keep_last complete checkpoints; drop stale partial ones.
    std::vector<std::string> steps;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!absl::StartsWith(name, "step-")) continue;
      if (absl::EndsWith(name, ".partial")) {
        fs::remove_all(entry.path(), ec);
      } else {
        steps.push_back(name);
      }
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + std::max(keep_last, 1) < steps.size(); ++i) {
      fs::remove_all(dir + "/" + steps[i], ec);
    }
  }
  return model.RunCollective([](collective::Communicator& c) { return c.Barrier(); });
}

absl::StatusOr<std::optional<TrainingState>> LoadLatestCheckpoint(const std::string& dir,
                                                                  FsdpModel& model,
                                                                  ShardedOptimizer& optimizer) {
  absl::StatusOr<std::string> step_dir = ReadLatest(dir);
  if (absl::IsNotFound(step_dir.status())) return std::optional<TrainingState>();
  PRL_RETURN_IF_ERROR(step_dir.status());
  const std::string path = *step_dir + "/" + RankFile(model.rank(), model.world_size());
  if (!fs::exists(path)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", *step_dir, " has no shard for rank ", model.rank(), " of ",
        model.world_size(), ": its world_size is '", WorldSizeOf(*step_dir), "', this run has '",
        model.world_size(),
        "' (resharding is not supported: prl export, then restart from the exported model)"));
  }
  PRL_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::Open(path));
  const auto m = Metadata(file);
  PRL_RETURN_IF_ERROR(Expect(m, "format", "prl-learner-shard-1", path));
  PRL_RETURN_IF_ERROR(Expect(m, "model", ModelFingerprint(model.config()), path));
  PRL_RETURN_IF_ERROR(Expect(m, "world_size", absl::StrCat(model.world_size()), path));
  const bool adamw = optimizer.config().kind == OptimizerKind::kAdamW;
  PRL_RETURN_IF_ERROR(Expect(m, "optimizer", adamw ? "adamw" : "sgd", path));
  PRL_ASSIGN_OR_RETURN(const TrainingState state, StateFrom(m, path));
  PRL_ASSIGN_OR_RETURN(const int64_t optimizer_step, IntField(m, "optimizer_step", path));
  PRL_RETURN_IF_ERROR(CopyTensor(file, "param_shard", model.param_shard()));
  if (adamw) {
    PRL_RETURN_IF_ERROR(CopyTensor(file, "exp_avg", optimizer.exp_avg()));
    PRL_RETURN_IF_ERROR(CopyTensor(file, "exp_avg_sq", optimizer.exp_avg_sq()));
  }
  optimizer.set_step(optimizer_step);
  PRL_RETURN_IF_ERROR(model.ParametersChanged());
  return std::optional<TrainingState>(state);
}

absl::StatusOr<ExportedCheckpoint> ReadCheckpointFull(const std::string& dir) {
  PRL_ASSIGN_OR_RETURN(const std::string step_dir, ReadLatest(dir));
  PRL_ASSIGN_OR_RETURN(const ModelConfig config, ReadModelConfig(step_dir));
  const int world = WorldSizeOf(step_dir);
  if (world < 1) return absl::DataLossError(absl::StrCat(step_dir, " holds no rank shards"));
  PRL_ASSIGN_OR_RETURN(ParameterSet params, ParameterSet::Allocate(config, Device::Cpu(), true));
  const std::vector<UnitShard> plan = PlanShards(params.layout, world);
  const int64_t shard_elems = ShardElements(plan);
  std::vector<float> shard(shard_elems);
  TrainingState state;
  for (int rank = 0; rank < world; ++rank) {
    const std::string path = step_dir + "/" + RankFile(rank, world);
    if (!fs::exists(path)) {
      return absl::DataLossError(
          absl::StrCat(step_dir, ": missing the shard of rank ", rank, " (", path, ")"));
    }
    PRL_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::Open(path));
    const auto m = Metadata(file);
    PRL_RETURN_IF_ERROR(Expect(m, "model", ModelFingerprint(config), path));
    if (rank == 0) {
      PRL_ASSIGN_OR_RETURN(state, StateFrom(m, path));
    }
    PRL_RETURN_IF_ERROR(CopyTensor(file, "param_shard", absl::MakeSpan(shard)));
    for (const UnitShard& u : plan) {
      const int64_t b = std::min(rank * u.shard, u.numel);
      const int64_t e = std::min((rank + 1) * u.shard, u.numel);
      std::copy(shard.begin() + u.shard_offset, shard.begin() + u.shard_offset + (e - b),
                params.data() + u.begin + b);
    }
  }
  return ExportedCheckpoint{std::move(params), state, step_dir};
}

}  // namespace prl::learner
