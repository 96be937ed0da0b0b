#include "tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::tokenizer {

namespace {

absl::Status AppendTemplate(const nlohmann::json& config, const JsonPath& path,
                            SpecialTokenFrame* frame) {
  PRL_ASSIGN_OR_RETURN(const nlohmann::json* single, GetArray(config, "single", path));
  PRL_ASSIGN_OR_RETURN(const nlohmann::json* specials, GetObject(config, "special_tokens", path));
  bool after_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const nlohmann::json& item = (*single)[i];
    const JsonPath where = path.Key("single").Index(i);
    if (item.contains("Sequence")) {
      PRL_ASSIGN_OR_RETURN(const std::string id,
                           GetString(item["Sequence"], "id", where.Key("Sequence")));
      if (id != "A" || after_sequence)
        return Unsupported(where.Key("Sequence").Key("id"), id, "one \"A\"");
      after_sequence = true;
    } else if (item.contains("SpecialToken")) {
      PRL_ASSIGN_OR_RETURN(const std::string name,
                           GetString(item["SpecialToken"], "id", where.Key("SpecialToken")));
      auto it = specials->find(name);
      if (it == specials->end()) {
        return absl::InvalidArgumentError(absl::StrCat(where.ToString(), ": special token \"", name,
                                                       "\" is not in special_tokens"));
      }
      const JsonPath ids_path = path.Key("special_tokens").Key(name);
      PRL_ASSIGN_OR_RETURN(const nlohmann::json* ids, GetArray(*it, "ids", ids_path));
      for (const nlohmann::json& id : *ids) {
        if (!id.is_number_integer()) return TypeError(ids_path.Key("ids"), "token ids", *ids);
        (after_sequence ? frame->suffix : frame->prefix).push_back(id.get<int32_t>());
      }
    } else {
      return TypeError(where, "{\"SpecialToken\": ...} or {\"Sequence\": ...}", item);
    }
  }
  frame->from_template = true;
  return absl::OkStatus();
}

absl::Status Append(const nlohmann::json& config, const JsonPath& path, SpecialTokenFrame* frame) {
  if (!config.is_object()) return TypeError(path, "a post-processor object", config);
  std::string type;
  PRL_RETURN_IF_ERROR(GetType(config, path, &type));
  if (type == "Sequence") {
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* list, GetArray(config, "processors", path));
    for (size_t i = 0; i < list->size(); ++i) {
      PRL_RETURN_IF_ERROR(Append((*list)[i], path.Key("processors").Index(i), frame));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "TemplateProcessing") {
    if (frame->from_template) {
      return Unsupported(path.Key("type"), "a second TemplateProcessing", "one per file");
    }
    return AppendTemplate(config, path, frame);
  }
  return Unsupported(path.Key("type"), type, "TemplateProcessing, ByteLevel, Sequence");
}

}  // namespace

absl::StatusOr<SpecialTokenFrame> PostProcessorFromJson(const nlohmann::json& config,
                                                        const JsonPath& path) {
  SpecialTokenFrame frame;
  if (!config.is_null()) PRL_RETURN_IF_ERROR(Append(config, path, &frame));
  return frame;
}

}  // namespace prl::tokenizer
