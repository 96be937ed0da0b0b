#include "checkpoint/peft_adapter.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl {
namespace {

namespace fs = std::filesystem;
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

}  // namespace

absl::StatusOr<LoraConfig> ReadAdapterConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  PRL_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  }
  auto error = [&](const std::string& key, const std::string& expected, const nlohmann::json& v) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", key, ": expected ", expected, ", found ", v.dump()));
  };
  const nlohmann::json type = j.value("peft_type", nlohmann::json());
  if (type != "LORA") return error("peft_type", "\"LORA\"", type);
  LoraConfig lora;
  if (!j.contains("r") || !j["r"].is_number_integer()) {
    return error("r", "an integer", j.value("r", nlohmann::json()));
  }
  lora.rank = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) {
    return error("lora_alpha", "a number", j.value("lora_alpha", nlohmann::json()));
  }
  lora.alpha = j["lora_alpha"].get<double>();
  const nlohmann::json rslora = j.value("use_rslora", nlohmann::json(false));
  if (!rslora.is_boolean()) return error("use_rslora", "true or false", rslora);
  lora.rslora = rslora.get<bool>();
  const nlohmann::json targets = j.value("target_modules", nlohmann::json());
  lora.target_modules.clear();
  if (targets.is_string()) {
    lora.target_modules.push_back(targets.get<std::string>());
  } else if (targets.is_array()) {
    for (const nlohmann::json& t : targets) {
      if (!t.is_string()) return error("target_modules", "module names", targets);
      lora.target_modules.push_back(t.get<std::string>());
    }
  } else {
    return error("target_modules", "a list of module names or \"all-linear\"", targets);
  }
  const nlohmann::json bias = j.value("bias", nlohmann::json("none"));
  if (bias != "none") return error("bias", "\"none\"", bias);
  // Features prl does not implement: absent, null, false or empty.
  for (const char* key : {"use_dora", "fan_in_fan_out"}) {
    const nlohmann::json v = j.value(key, nlohmann::json(false));
    if (!(v.is_null() || v == false)) return error(key, "false (not supported)", v);
  }
  for (const char* key : {"rank_pattern", "alpha_pattern", "layers_to_transform",
                          "modules_to_save", "layers_pattern"}) {
    const nlohmann::json v = j.value(key, nlohmann::json());
    if (!(v.is_null() || ((v.is_object() || v.is_array()) && v.empty()))) {
      return error(key, "null or empty (not supported)", v);
    }
  }
  return lora;
}

absl::StatusOr<LoraSet> LoadAdapter(const std::string& dir, const ModelConfig& model) {
  PRL_ASSIGN_OR_RETURN(const LoraConfig lora, ReadAdapterConfig(dir));
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  if (absl::Status s = ValidateLoraConfig(lora, model); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", s.message()));
  }
  PRL_ASSIGN_OR_RETURN(LoraSet set, LoraSet::Allocate(model, lora, Device::Cpu(), false));
  PRL_ASSIGN_OR_RETURN(const SafetensorsFile file,
                       SafetensorsFile::Open((fs::path(dir) / kWeightsFile).string()));
  size_t found = 0;
  for (const LoraEntry& e : set.layout.entries()) {
    const SafetensorsEntry* t = file.header().Find(e.name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": missing tensor '", e.name, "' (", config_path,
                       " targets it)"));
    }
    if (t->shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": tensor '", e.name, "' has shape [", absl::StrJoin(t->shape, ", "),
          "], expected [", absl::StrJoin(e.shape, ", "), "]"));
    }
    const std::optional<DType> dtype = DTypeFromName(t->dtype);
    if (!dtype || *dtype == DType::kI32) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", e.name,
                                                     "' has dtype ", t->dtype,
                                                     "; expected F32, BF16 or F16"));
    }
    ConvertToF32(set.data() + e.offset, file.Data(*t).data(), *dtype,
                 static_cast<size_t>(e.numel));
    ++found;
  }
  if (found != file.header().tensors.size()) {
    for (const SafetensorsEntry& t : file.header().tensors) {
      bool known = false;
      for (const LoraEntry& e : set.layout.entries()) known = known || e.name == t.name;
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            file.path(), ": tensor '", t.name, "' is not one of ", config_path,
            "'s targets (a module prl does not adapt, or another layout)"));
      }
    }
  }
  return set;
}

std::string AdapterConfigJson(const LoraConfig& lora, const std::string& base_model) {
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", lora.rank},
      {"lora_alpha", lora.alpha},
      {"use_rslora", lora.rslora},
      {"target_modules", lora.target_modules},
      {"lora_dropout", 0.0},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
  };
  return config.dump(2) + "\n";
}

absl::Status SaveAdapter(const std::string& dir, const LoraSet& adapter,
                         const std::string& base_model) {
  PRL_CHECK(adapter.buffer.device().is_cpu(), "SaveAdapter: a CPU set");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", dir, ": ", ec.message()));
  PRL_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / kConfigFile).string(),
                                          AdapterConfigJson(adapter.lora, base_model)));
  return SaveAdapterTensors((fs::path(dir) / kWeightsFile).string(), adapter);
}

absl::Status SaveAdapterTensors(const std::string& path, const LoraSet& adapter) {
  PRL_CHECK(adapter.buffer.device().is_cpu(), "SaveAdapterTensors: a CPU set");
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const LoraEntry& e : adapter.layout.entries()) {
    tensors.push_back({e.name, e.shape, adapter.data() + e.offset});
  }
  return WriteSafetensors(path, tensors, DType::kF32, {{"format", "pt"}});
}

}  // namespace prl
