#include "checkpoint/hf_model_dir.h"

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl {

namespace fs = std::filesystem;

namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// name -> file (relative to dir) for every tensor of the checkpoint.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& dir) {
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  PRL_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path));
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": malformed JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": expected an object with a 'weight_map' object"));
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map['", name, "'] must be a file name"));
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map['", name, "'] = '",
                                                     f, "' is not a file in the directory"));
    }
    map[name] = f;
  }
  return map;
}

bool IgnoredByTransformers(const std::string& name, const ModelConfig& config) {
  if (name.ends_with(".rotary_emb.inv_freq")) return true;
  return name == "lm_head.weight" && config.tie_word_embeddings;
}

}  // namespace

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  PRL_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  return ParseModelConfig(text, path);
}

absl::StatusOr<ParameterSet> LoadModel(const std::string& dir, Device device) {
  PRL_ASSIGN_OR_RETURN(const ModelConfig config, ReadModelConfig(dir));

  // Which file holds each tensor.
  std::map<std::string, std::string> weight_map;
  std::map<std::string, SafetensorsFile> files;
  if (fs::exists(fs::path(dir) / kSingleFile)) {
    PRL_ASSIGN_OR_RETURN(SafetensorsFile f,
                         SafetensorsFile::Open((fs::path(dir) / kSingleFile).string()));
    for (const SafetensorsEntry& e : f.header().tensors) weight_map[e.name] = kSingleFile;
    files.emplace(kSingleFile, std::move(f));
  } else if (fs::exists(fs::path(dir) / kIndexFile)) {
    PRL_ASSIGN_OR_RETURN(weight_map, ReadWeightMap(dir));
    for (const auto& [name, file] : weight_map) {
      if (files.count(file)) continue;
      PRL_ASSIGN_OR_RETURN(SafetensorsFile f,
                           SafetensorsFile::Open((fs::path(dir) / file).string()));
      files.emplace(file, std::move(f));
    }
    // A shard tensor missing from the index would be silently skipped by transformers' index
    // logic too, but it means the index and the shards disagree: refuse.
    for (const auto& [file, f] : files) {
      for (const SafetensorsEntry& e : f.header().tensors) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end() || it->second != file) {
          return absl::InvalidArgumentError(absl::StrCat(
              f.path(), ": tensor '", e.name, "' is not mapped to this file by ", kIndexFile));
        }
      }
    }
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither ", kSingleFile, " nor ", kIndexFile, " found"));
  }

  PRL_ASSIGN_OR_RETURN(ParameterSet set, ParameterSet::Allocate(config, device, false));
  std::vector<float> staging;
  std::set<std::string> used;
  for (const ParamEntry& p : set.layout.entries()) {
    auto where = weight_map.find(p.name);
    if (where == weight_map.end()) {
      return absl::NotFoundError(absl::StrCat(dir, ": missing tensor '", p.name,
                                              "' (config.json implies shape ", ShapeText(p.shape),
                                              ")"));
    }
    const SafetensorsFile& f = files.at(where->second);
    const SafetensorsEntry* e = f.header().Find(p.name);
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrCat(f.path(), ": missing tensor '", p.name,
                                              "' (the index maps it to this file)"));
    }
    const std::optional<DType> dtype = DTypeFromName(e->dtype);
    if (!dtype || *dtype == DType::kI32) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", p.name, "' has dtype ",
                                                     e->dtype, "; expected F32, BF16 or F16"));
    }
    if (e->shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tensor '", p.name, "' has shape ", ShapeText(e->shape),
                       " but config.json implies ", ShapeText(p.shape)));
    }
    const absl::Span<const uint8_t> bytes = f.Data(*e);
    float* dst = set.data() + p.offset;
    if (device.is_cpu()) {
      ConvertToF32(dst, bytes.data(), *dtype, p.numel);
    } else {
      staging.resize(p.numel);
      ConvertToF32(staging.data(), bytes.data(), *dtype, p.numel);
      PRL_RETURN_IF_ERROR(
          CopyBytes(dst, device, staging.data(), Device::Cpu(), p.numel * sizeof(float)));
    }
    used.insert(p.name);
  }
  for (const auto& [name, file] : weight_map) {
    if (used.count(name) || IgnoredByTransformers(name, config)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/", file, ": unexpected tensor '", name, "' for a ", ArchitectureName(config.arch),
        " with this config.json; refusing a partial load"));
  }
  return set;
}

namespace {

absl::StatusOr<std::vector<float>> HostCopyIfNeeded(const ParameterSet& set) {
  std::vector<float> host;
  if (set.buffer.device().is_cpu()) return host;
  host.resize(set.layout.num_elements());
  PRL_RETURN_IF_ERROR(CopyBytes(host.data(), Device::Cpu(), set.data(), set.buffer.device(),
                                host.size() * sizeof(float)));
  return host;
}

std::vector<SafetensorsTensorToWrite> TensorsToWrite(const ParameterSet& set, const float* base) {
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const ParamEntry& p : set.layout.entries()) {
    tensors.push_back({p.name, p.shape, base + p.offset});
  }
  return tensors;
}

const std::vector<std::pair<std::string, std::string>> kPtMetadata = {{"format", "pt"}};

// Deletes the shards of an earlier sharded save (model-XXXXX-of-YYYYY.safetensors) that are not
// in `keep`, as save_pretrained does: a re-save with another shard count, or unsharded, must
// not leave the old weights behind.
void RemoveStaleShards(const fs::path& dir, const std::set<std::string>& keep) {
  static const std::regex kShardName(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!keep.count(name) && std::regex_match(name, kShardName)) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
}

}  // namespace

absl::Status SaveModel(const std::string& dir, const ParameterSet& set,
                       const SaveModelOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  PRL_RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(dir) / "config.json").string(), ModelConfigToJson(set.config)));
  PRL_ASSIGN_OR_RETURN(const std::vector<float> host, HostCopyIfNeeded(set));
  const float* base = host.empty() ? set.data() : host.data();
  const std::vector<SafetensorsTensorToWrite> tensors = TensorsToWrite(set, base);
  const uint64_t total = SafetensorsDataBytes(tensors, options.dtype);

  // Group tensors into shards in buffer order (greedy, like save_pretrained).
  std::vector<std::vector<SafetensorsTensorToWrite>> shards(1);
  uint64_t shard_bytes = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = SafetensorsDataBytes({&t, 1}, options.dtype);
    if (options.max_shard_bytes > 0 && shard_bytes > 0 &&
        shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
  }

  const fs::path single = fs::path(dir) / kSingleFile;
  const fs::path index_path = fs::path(dir) / kIndexFile;
  if (shards.size() == 1) {
    PRL_RETURN_IF_ERROR(WriteSafetensors(single.string(), tensors, options.dtype, kPtMetadata));
    fs::remove(index_path, ec);
    RemoveStaleShards(dir, {});
    return absl::OkStatus();
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::set<std::string> shard_names;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    PRL_RETURN_IF_ERROR(
        WriteSafetensors((fs::path(dir) / name).string(), shards[s], options.dtype, kPtMetadata));
    for (const auto& t : shards[s]) weight_map[t.name] = name;
    shard_names.insert(name);
  }
  index["weight_map"] = weight_map;
  PRL_RETURN_IF_ERROR(WriteFileAtomically(index_path.string(), index.dump(2) + "\n"));
  // The loader (like transformers) prefers model.safetensors: a stale one must go.
  fs::remove(single, ec);
  RemoveStaleShards(dir, shard_names);
  return absl::OkStatus();
}

absl::Status SaveParameterSetTensors(const std::string& path, const ParameterSet& set) {
  PRL_ASSIGN_OR_RETURN(const std::vector<float> host, HostCopyIfNeeded(set));
  const float* base = host.empty() ? set.data() : host.data();
  return WriteSafetensors(path, TensorsToWrite(set, base), DType::kF32, kPtMetadata);
}

absl::Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                           "special_tokens_map.json"}) {
    const fs::path source = fs::path(from_dir) / name;
    if (!fs::exists(source)) continue;
    std::error_code ec;
    fs::copy_file(source, fs::path(to_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("copying ", source.string(), " to ", to_dir, ": ",
                                              ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace prl
