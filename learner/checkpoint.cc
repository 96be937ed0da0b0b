#include "learner/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/peft_adapter.h"
#include "checkpoint/safetensors.h"
#include "core/buffer.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"

namespace prl::learner {

namespace fs = std::filesystem;

namespace {

constexpr const char* kAdapterConfigFile = "adapter_config.json";  // LoRA checkpoints

std::string StepName(int64_t step) { return absl::StrFormat("step-%08d", step); }
std::string RankFile(int rank, int world) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world);
}

// What must match for a shard to be loadable here.
std::string ModelFingerprint(const ModelConfig& c) {
  return absl::StrCat(
      ArchitectureName(c.arch), " hidden=", c.hidden_size, " layers=", c.num_hidden_layers,
      " heads=", c.num_attention_heads, "/", c.num_key_value_heads, " head_dim=", c.head_dim,
      " intermediate=", c.intermediate_size, " vocab=", c.vocab_size,
      " tied=", c.tie_word_embeddings, " qkv_bias=", c.qkv_bias,
      c.has_moe()
          ? absl::StrCat(" experts=", c.num_experts, " top_k=", c.num_experts_per_tok,
                         " moe_intermediate=", c.moe_intermediate_size,
                         " norm_topk=", c.norm_topk_prob, " moe_layers=", c.num_moe_layers(),
                         " sparse_step=", c.decoder_sparse_step,
                         " mlp_only=", absl::StrJoin(c.mlp_only_layers, ","))
          : std::string());
}

// The checkpoints a resume may use, in the order to try them: the one `latest` names, then
// every other complete step directory, newest first (a crash between the rename of a step and
// the rewrite of `latest` leaves a complete step newer than `latest`).
struct Candidates {
  std::vector<std::string> steps;  // directories, in order
  bool has_latest = false;         // `latest` exists
  std::string latest_problem;      // why `latest` itself is unusable ("" if it is fine)
};

Candidates FindCandidates(const std::string& dir) {
  Candidates c;
  std::string named;
  if (std::ifstream in(dir + "/latest"); in) {
    c.has_latest = true;
    std::getline(in, named);
    if (named.empty() || !fs::is_directory(dir + "/" + named)) {
      c.latest_problem =
          absl::StrCat(dir, "/latest names '", named, "', which is not a checkpoint directory");
    } else {
      c.steps.push_back(dir + "/" + named);
    }
  }
  std::vector<std::string> others;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "step-") && !absl::EndsWith(name, ".partial") &&
        entry.is_directory() && name != named) {
      others.push_back(name);
    }
  }
  std::sort(others.rbegin(), others.rend());
  for (const std::string& name : others) c.steps.push_back(dir + "/" + name);
  return c;
}

// The error when no candidate is usable.
absl::Status NoCheckpoint(const std::string& dir, const Candidates& c, const std::string& last) {
  return absl::DataLossError(absl::StrCat(
      c.latest_problem.empty() ? absl::StrCat("no complete checkpoint in ", dir) : c.latest_problem,
      last.empty() ? ", and no complete checkpoint to fall back to"
                   : absl::StrCat("; no complete checkpoint to fall back to (", last, ")")));
}

// Says on stderr that the resume skips `step_dir`.
void NoteFallback(const std::string& step_dir, absl::string_view why) {
  std::fprintf(stderr, "checkpoint: %s cannot be used (%s); falling back to an older one\n",
               step_dir.c_str(), std::string(why).c_str());
  std::fflush(stderr);
}

// Tensor checksums in a shard's metadata ("xxh3_<tensor>"), checked at load: a bit flipped on
// disk makes a checkpoint damaged, never silently wrong.
std::string Xxh3Hex(const void* data, size_t bytes) {
  return absl::StrCat(absl::Hex(XXH3_64bits(data, bytes), absl::kZeroPad16));
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

// Into `out`, which lives on `device` (a CUDA learner's shards are device memory).
absl::Status CopyTensor(const SafetensorsFile& file, const std::string& name, Device device,
                        absl::Span<float> out) {
  const SafetensorsEntry* e = file.header().Find(name);
  if (e == nullptr || e->dtype != "F32" || e->numel() != static_cast<int64_t>(out.size())) {
    return absl::DataLossError(absl::StrCat(file.path(), ": tensor '", name, "' must be F32 with ",
                                            out.size(), " elements"));
  }
  const absl::Span<const uint8_t> data = file.Data(*e);
  return CopyBytes(out.data(), device, data.data(), Device::Cpu(), data.size());
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

// What a shard's "adapter" metadata says of the trained parameters: a LoRA adapter's settings
// (LoraFingerprint), or none (every weight; also a shard written before adapters existed).
std::string AdapterOf(const FsdpModel& model) {
  return model.lora_config() != nullptr ? LoraFingerprint(*model.lora_config()) : "none";
}
absl::Status ExpectAdapter(const std::map<std::string, std::string>& m, const FsdpModel& model,
                           const std::string& path) {
  auto it = m.find("adapter");
  const std::string found = it == m.end() ? "none" : it->second;
  if (found == AdapterOf(model)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      path, ": checkpoint adapter is '", found, "', this run has '", AdapterOf(model),
      "' (a checkpoint trains either every weight or one LoRA adapter of given settings: keep "
      "learner.lora_* as the run that wrote it)"));
}

// Every tensor of `file` whose checksum the metadata holds matches it.
absl::Status VerifyChecksums(const SafetensorsFile& file,
                             const std::map<std::string, std::string>& m) {
  for (const SafetensorsEntry& e : file.header().tensors) {
    auto it = m.find("xxh3_" + e.name);
    if (it == m.end()) continue;  // written before checksums existed
    const absl::Span<const uint8_t> data = file.Data(e);
    const std::string found = Xxh3Hex(data.data(), data.size());
    if (found != it->second) {
      return absl::DataLossError(absl::StrCat(file.path(), ": tensor '", e.name, "' has XXH3 ",
                                              found, ", its metadata says ", it->second,
                                              " (damaged on disk)"));
    }
  }
  return absl::OkStatus();
}

// This rank's shard of `step_dir`, checked: FailedPrecondition if it was written for another
// run (model, world size, optimizer: no older checkpoint would fit either); any other error
// means the checkpoint is damaged or incomplete.
absl::StatusOr<SafetensorsFile> OpenShard(const std::string& step_dir, FsdpModel& model,
                                          ShardedOptimizer& optimizer) {
  const std::string path = step_dir + "/" + RankFile(model.rank(), model.world_size());
  if (!fs::exists(path)) {
    const int saved_world = WorldSizeOf(step_dir);
    if (saved_world == model.world_size() || saved_world == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, " has no shard for rank ",
                                              model.rank(), " (", path, ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", step_dir, " has no shard for rank ", model.rank(), " of ",
        model.world_size(), ": its world_size is '", saved_world, "', this run has '",
        model.world_size(),
        "' (resharding is not supported: prl export, then restart from the exported model)"));
  }
  PRL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  const auto m = Metadata(file);
  PRL_RETURN_IF_ERROR(Expect(m, "format", "prl-learner-shard-1", path));
  PRL_RETURN_IF_ERROR(Expect(m, "model", ModelFingerprint(model.config()), path));
  PRL_RETURN_IF_ERROR(ExpectAdapter(m, model, path));
  PRL_RETURN_IF_ERROR(Expect(m, "world_size", absl::StrCat(model.world_size()), path));
  const bool adamw = optimizer.config().kind == OptimizerKind::kAdamW;
  PRL_RETURN_IF_ERROR(Expect(m, "optimizer", adamw ? "adamw" : "sgd", path));
  PRL_RETURN_IF_ERROR(StateFrom(m, path).status());
  PRL_RETURN_IF_ERROR(IntField(m, "optimizer_step", path).status());
  PRL_RETURN_IF_ERROR(VerifyChecksums(file, m));
  return file;
}

// Loads a shard OpenShard accepted.
absl::StatusOr<std::optional<TrainingState>> LoadShard(const SafetensorsFile& file,
                                                       FsdpModel& model,
                                                       ShardedOptimizer& optimizer) {
  const auto m = Metadata(file);
  PRL_ASSIGN_OR_RETURN(const TrainingState state, StateFrom(m, file.path()));
  PRL_ASSIGN_OR_RETURN(const int64_t optimizer_step, IntField(m, "optimizer_step", file.path()));
  const Device device = model.device();
  PRL_RETURN_IF_ERROR(CopyTensor(file, "param_shard", device, model.param_shard()));
  if (optimizer.config().kind == OptimizerKind::kAdamW) {
    PRL_RETURN_IF_ERROR(CopyTensor(file, "exp_avg", device, optimizer.exp_avg()));
    PRL_RETURN_IF_ERROR(CopyTensor(file, "exp_avg_sq", device, optimizer.exp_avg_sq()));
  }
  optimizer.set_step(optimizer_step);
  PRL_RETURN_IF_ERROR(model.ParametersChanged());
  return std::optional<TrainingState>(state);
}

// The full trained parameters of one step directory, from every rank's shard (all checked):
// the model's, or a LoRA checkpoint's adapter (one unit, learner/fsdp.h).
absl::StatusOr<ExportedCheckpoint> ReadStepFull(const std::string& step_dir) {
  PRL_ASSIGN_OR_RETURN(const ModelConfig config, ReadModelConfig(step_dir));
  const int world = WorldSizeOf(step_dir);
  if (world < 1) return absl::DataLossError(absl::StrCat(step_dir, " holds no rank shards"));
  ExportedCheckpoint out;
  out.path = step_dir;
  std::vector<UnitShard> plan;
  float* full = nullptr;
  std::string adapter = "none";
  if (fs::exists(step_dir + "/" + kAdapterConfigFile)) {
    PRL_ASSIGN_OR_RETURN(const LoraConfig lora, ReadAdapterConfig(step_dir));
    PRL_ASSIGN_OR_RETURN(out.adapter, LoraSet::Allocate(config, lora, Device::Cpu(), true));
    const int64_t n = out.adapter->layout.num_elements();
    plan = {UnitShard{0, n, (n + world - 1) / world, 0}};
    full = out.adapter->data();
    adapter = LoraFingerprint(lora);
  } else {
    PRL_ASSIGN_OR_RETURN(out.params, ParameterSet::Allocate(config, Device::Cpu(), true));
    plan = PlanShards(out.params->layout, world);
    full = out.params->data();
  }
  std::vector<float> shard(ShardElements(plan));
  for (int rank = 0; rank < world; ++rank) {
    const std::string path = step_dir + "/" + RankFile(rank, world);
    if (!fs::exists(path)) {
      return absl::DataLossError(
          absl::StrCat(step_dir, ": missing the shard of rank ", rank, " (", path, ")"));
    }
    PRL_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::Open(path));
    const auto m = Metadata(file);
    PRL_RETURN_IF_ERROR(Expect(m, "model", ModelFingerprint(config), path));
    if (m.count("adapter") > 0 || adapter != "none") {
      PRL_RETURN_IF_ERROR(Expect(m, "adapter", adapter, path));
    }
    PRL_RETURN_IF_ERROR(VerifyChecksums(file, m));
    if (rank == 0) {
      PRL_ASSIGN_OR_RETURN(out.state, StateFrom(m, path));
    }
    PRL_RETURN_IF_ERROR(CopyTensor(file, "param_shard", Device::Cpu(), absl::MakeSpan(shard)));
    for (const UnitShard& u : plan) {
      const int64_t b = std::min(rank * u.shard, u.numel);
      const int64_t e = std::min((rank + 1) * u.shard, u.numel);
      std::copy(shard.begin() + u.shard_offset, shard.begin() + u.shard_offset + (e - b),
                full + u.begin + b);
    }
  }
  return out;
}

}  // namespace

std::string CheckpointStepDir(const std::string& dir, int64_t step) {
  return dir + "/" + StepName(step);
}

absl::Status SaveCheckpoint(const std::string& dir, FsdpModel& model, ShardedOptimizer& optimizer,
                            const TrainingState& state, int keep_last,
                            const CheckpointExtras& extras) {
  const int rank = model.rank(), world = model.world_size();
  const std::string final_dir = dir + "/" + StepName(state.step);
  const std::string partial = final_dir + ".partial";
  std::error_code ec;
  if (rank == 0) {
    if (!fs::is_directory(dir)) {
      fs::create_directories(dir, ec);
      PRL_RETURN_IF_ERROR(FsyncDirectory(ParentDirectory(dir)));
    }
    fs::remove_all(partial, ec);
    if (!fs::create_directories(partial, ec) && ec) {
      return absl::InternalError(absl::StrCat("cannot create ", partial, ": ", ec.message()));
    }
  }
  PRL_RETURN_IF_ERROR(model.RunCollective([](collective::Communicator& c) { return c.Barrier(); }));

  // The shards on the host: a CUDA learner's are copied out first.
  std::vector<std::vector<float>> staged;
  auto on_host = [&](absl::Span<float> shard) -> absl::StatusOr<const float*> {
    if (model.device().is_cpu()) return shard.data();
    std::vector<float>& host = staged.emplace_back(shard.size());
    PRL_RETURN_IF_ERROR(CopyBytes(host.data(), Device::Cpu(), shard.data(), model.device(),
                                  shard.size() * sizeof(float)));
    return host.data();
  };
  const int64_t n = static_cast<int64_t>(model.param_shard().size());
  PRL_ASSIGN_OR_RETURN(const float* params, on_host(model.param_shard()));
  std::vector<SafetensorsTensorToWrite> tensors = {{"param_shard", {n}, params}};
  if (optimizer.config().kind == OptimizerKind::kAdamW) {
    PRL_ASSIGN_OR_RETURN(const float* exp_avg, on_host(optimizer.exp_avg()));
    PRL_ASSIGN_OR_RETURN(const float* exp_avg_sq, on_host(optimizer.exp_avg_sq()));
    tensors.push_back({"exp_avg", {n}, exp_avg});
    tensors.push_back({"exp_avg_sq", {n}, exp_avg_sq});
  }
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "prl-learner-shard-1"},
      {"model", ModelFingerprint(model.config())},
      {"adapter", AdapterOf(model)},
      {"world_size", absl::StrCat(world)},
      {"rank", absl::StrCat(rank)},
      {"optimizer", optimizer.config().kind == OptimizerKind::kAdamW ? "adamw" : "sgd"},
      {"optimizer_step", absl::StrCat(optimizer.step())},
      {"step", absl::StrCat(state.step)},
      {"weight_version", absl::StrCat(state.weight_version)},
      {"data_position", absl::StrCat(state.data_position)},
      {"rng_seed", absl::StrCat(state.rng_seed)},
      {"rng_counter", absl::StrCat(state.rng_counter)}};
  std::vector<std::pair<std::string, std::string>> signed_metadata = metadata;
  for (const SafetensorsTensorToWrite& t : tensors) {
    signed_metadata.emplace_back("xxh3_" + t.name, Xxh3Hex(t.data, n * sizeof(float)));
  }
  const absl::Status wrote = WriteSafetensors(partial + "/" + RankFile(rank, world), tensors,
                                              DType::kF32, signed_metadata);
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
    if (model.lora_config() != nullptr) {  // the adapter's settings, for prl export --adapter
      PRL_RETURN_IF_ERROR(WriteFileAtomically(partial + "/" + kAdapterConfigFile,
                                              AdapterConfigJson(*model.lora_config(), "")));
    }
    if (extras) PRL_RETURN_IF_ERROR(extras(partial));
    // Every shard and config.json is fsync'd, and so is step-N.partial/ after each of their
    // renames (AtomicFileWriter); the step's own rename is made durable before `latest` names
    // it, and `latest` is rewritten atomically (its directory fsync'd too).
    fs::remove_all(final_dir, ec);
    fs::rename(partial, final_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot rename ", partial, ": ", ec.message()));
    PRL_RETURN_IF_ERROR(FsyncDirectory(dir));
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
  const Candidates candidates = FindCandidates(dir);
  if (!candidates.has_latest && candidates.steps.empty()) return std::optional<TrainingState>();
  if (!candidates.latest_problem.empty() && model.rank() == 0) {
    NoteFallback(dir + "/latest", candidates.latest_problem);
  }
  std::string last_damage;
  for (const std::string& step_dir : candidates.steps) {
    absl::StatusOr<SafetensorsFile> shard = OpenShard(step_dir, model, optimizer);
    // Every rank must load the same step: 0 usable, 1 damaged here, 2 not for this run.
    double verdict = shard.ok() ? 0 : absl::IsFailedPrecondition(shard.status()) ? 2 : 1;
    PRL_RETURN_IF_ERROR(model.RunCollective([&](collective::Communicator& c) {
      return c.AllReduceHost({&verdict, 1}, collective::ReduceOp::kMax);
    }));
    if (verdict == 2) {
      if (!shard.ok()) return shard.status();
      return absl::AbortedError(
          absl::StrCat("checkpoint ", step_dir, ": another rank cannot use it (see its error)"));
    }
    if (verdict == 1) {
      last_damage = shard.ok() ? "damaged on another rank" : std::string(shard.status().message());
      if (!shard.ok()) NoteFallback(step_dir, shard.status().message());
      continue;
    }
    return LoadShard(*shard, model, optimizer);
  }
  return NoCheckpoint(dir, candidates, last_damage);
}

absl::StatusOr<ExportedCheckpoint> ReadCheckpointFull(const std::string& dir) {
  const Candidates candidates = FindCandidates(dir);
  if (!candidates.has_latest && candidates.steps.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  }
  if (!candidates.latest_problem.empty()) NoteFallback(dir + "/latest", candidates.latest_problem);
  std::string last_damage;
  for (const std::string& step_dir : candidates.steps) {
    absl::StatusOr<ExportedCheckpoint> read = ReadStepFull(step_dir);
    if (read.ok()) return read;
    last_damage = std::string(read.status().message());
    NoteFallback(step_dir, last_damage);
  }
  return NoCheckpoint(dir, candidates, last_damage);
}

}  // namespace prl::learner
