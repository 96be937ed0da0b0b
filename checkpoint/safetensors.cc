#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl {

namespace {

using Json = nlohmann::json;

// Raised inside the JSON parser callback; caught in ParseSafetensorsHeader and never escapes.
struct HeaderShapeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

absl::Status Invalid(absl::string_view source, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses the header JSON, rejecting duplicate keys (nlohmann would keep the last silently) and
// nesting deeper than the format allows (root object > tensor object > shape array).
Json ParseStrictJson(absl::string_view text) {
  std::vector<std::set<std::string>> keys_per_object;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    if (depth > 3) throw HeaderShapeError("JSON nested deeper than a safetensors header allows");
    switch (event) {
      case Json::parse_event_t::object_start:
        keys_per_object.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys_per_object.empty()) keys_per_object.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        if (!keys_per_object.empty() && !keys_per_object.back().insert(key).second) {
          throw HeaderShapeError(absl::StrCat("duplicate key '", key, "'"));
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  return Json::parse(text.begin(), text.end(), callback);
}

absl::StatusOr<uint64_t> NonNegativeInt(const Json& v, absl::string_view source,
                                        absl::string_view what) {
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
    return Invalid(source,
                   absl::StrCat(what, ": expected a non-negative integer, found ", v.dump()));
  }
  return v.get<uint64_t>();
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& v,
                                            absl::string_view source) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!v.is_object()) return Invalid(source, absl::StrCat(where, ": expected an object"));
  for (const auto& [key, unused] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Invalid(source, absl::StrCat(where, ": unknown key '", key, "'"));
    }
  }
  SafetensorsEntry e;
  e.name = name;
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    return Invalid(source, absl::StrCat(where, ": 'dtype' missing or not a string"));
  }
  e.dtype = dtype->get<std::string>();
  const size_t elem_size = SafetensorsDTypeSize(e.dtype);
  if (elem_size == 0)
    return Invalid(source, absl::StrCat(where, ": unknown dtype '", e.dtype, "'"));

  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) {
    return Invalid(source, absl::StrCat(where, ": 'shape' missing or not an array"));
  }
  uint64_t numel = 1;
  for (const Json& d : *shape) {
    PRL_ASSIGN_OR_RETURN(const uint64_t dim, NonNegativeInt(d, source, where + " shape"));
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) {
      return Invalid(source, absl::StrCat(where, ": shape ", shape->dump(), " overflows"));
    }
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &nbytes)) {
    return Invalid(source, absl::StrCat(where, ": shape ", shape->dump(), " overflows"));
  }

  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
    return Invalid(source, absl::StrCat(where, ": 'data_offsets' must be [begin, end]"));
  }
  PRL_ASSIGN_OR_RETURN(e.begin, NonNegativeInt((*offsets)[0], source, where + " data_offsets"));
  PRL_ASSIGN_OR_RETURN(e.end, NonNegativeInt((*offsets)[1], source, where + " data_offsets"));
  if (e.end < e.begin) {
    return Invalid(source, absl::StrCat(where, ": data_offsets [", e.begin, ", ", e.end,
                                        "] end before they begin"));
  }
  if (e.end - e.begin != nbytes) {
    return Invalid(source,
                   absl::StrCat(where, ": data_offsets span ", e.end - e.begin, " bytes but shape ",
                                shape->dump(), " of ", e.dtype, " needs ", nbytes));
  }
  return e;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t SafetensorsDTypeSize(absl::string_view dtype) {
  static const std::map<absl::string_view, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

const SafetensorsEntry* SafetensorsHeader::Find(absl::string_view name) const {
  auto it =
      std::lower_bound(tensors.begin(), tensors.end(), name,
                       [](const SafetensorsEntry& e, absl::string_view n) { return e.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::Span<const uint8_t> file,
                                                         absl::string_view source) {
  if (file.size() < 8) {
    return Invalid(source, absl::StrCat("truncated: ", file.size(),
                                        " bytes, but a safetensors file starts with an 8-byte "
                                        "header length"));
  }
  const uint64_t header_len = ReadLe64(file.data());
  if (header_len > file.size() - 8) {
    return Invalid(source,
                   absl::StrCat("header length ", header_len, " runs past the end of the file (",
                                file.size(), " bytes); the file is truncated or not safetensors"));
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                        kMaxSafetensorsHeaderBytes, " bytes"));
  }
  const absl::string_view text(reinterpret_cast<const char*>(file.data() + 8), header_len);
  Json root;
  try {
    root = ParseStrictJson(text);
  } catch (const HeaderShapeError& e) {
    return Invalid(source, absl::StrCat("malformed header: ", e.what()));
  } catch (const Json::exception& e) {
    return Invalid(source, absl::StrCat("malformed header JSON: ", e.what()));
  }
  if (!root.is_object()) return Invalid(source, "malformed header: expected a JSON object");

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  header.data_size = file.size() - header.data_offset;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Invalid(source, "'__metadata__' must be an object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) {
          return Invalid(source, absl::StrCat("'__metadata__' value of '", key,
                                              "' must be a string, found ", text_value.dump()));
        }
        header.metadata.emplace_back(key, text_value.get<std::string>());
      }
      continue;
    }
    PRL_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(name, value, source));
    if (entry.end > header.data_size) {
      return Invalid(source, absl::StrCat("tensor '", name, "': data_offsets [", entry.begin, ", ",
                                          entry.end, "] run past the data section (",
                                          header.data_size, " bytes); the file is truncated"));
    }
    header.tensors.push_back(std::move(entry));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });

  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : header.tensors) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(
      by_offset.begin(), by_offset.end(),
      [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Invalid(source, absl::StrCat("tensors '", by_offset[i - 1]->name, "' and '",
                                          by_offset[i]->name, "' have overlapping data_offsets"));
    }
  }
  return header;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  PRL_ASSIGN_OR_RETURN(f.file_, MappedFile::Open(path));
  PRL_ASSIGN_OR_RETURN(f.header_, ParseSafetensorsHeader(f.file_.bytes(), path));
  return f;
}

absl::Span<const uint8_t> SafetensorsFile::Data(const SafetensorsEntry& entry) const {
  return file_.bytes().subspan(header_.data_offset + entry.begin, entry.end - entry.begin);
}

uint64_t SafetensorsDataBytes(absl::Span<const SafetensorsTensorToWrite> tensors, DType dtype) {
  uint64_t bytes = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    bytes += n * DTypeSize(dtype);
  }
  return bytes;
}

absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsTensorToWrite> tensors, DType dtype,
                              const std::vector<std::pair<std::string, std::string>>& metadata) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors output dtype must be F32, BF16 or F16, not ", DTypeName(dtype)));
  }
  std::vector<const SafetensorsTensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i]->name == "__metadata__" || sorted[i]->name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", sorted[i]->name, "' cannot name a tensor"));
    }
    if (i > 0 && sorted[i]->name == sorted[i - 1]->name) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": two tensors are named '", sorted[i]->name, "'"));
    }
  }

  nlohmann::ordered_json header;
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto* t : sorted) {
    uint64_t n = 1;
    for (int64_t d : t->shape) n *= static_cast<uint64_t>(d);
    const uint64_t bytes = n * DTypeSize(dtype);
    header[t->name] = {{"dtype", std::string(DTypeName(dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();  // throws on names that are not valid UTF-8
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor names must be valid UTF-8: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(text.size() >> (8 * i));

  PRL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  PRL_RETURN_IF_ERROR(writer.Append(len_bytes, 8));
  PRL_RETURN_IF_ERROR(writer.Append(text.data(), text.size()));
  constexpr size_t kChunk = 1 << 20;  // elements converted per write
  std::vector<uint8_t> staging;
  for (const auto* t : sorted) {
    uint64_t n = 1;
    for (int64_t d : t->shape) n *= static_cast<uint64_t>(d);
    if (dtype == DType::kF32) {
      PRL_RETURN_IF_ERROR(writer.Append(t->data, n * sizeof(float)));
      continue;
    }
    for (uint64_t i = 0; i < n; i += kChunk) {
      const size_t count = static_cast<size_t>(std::min<uint64_t>(kChunk, n - i));
      staging.resize(count * DTypeSize(dtype));
      ConvertFromF32(staging.data(), dtype, t->data + i, count);
      PRL_RETURN_IF_ERROR(writer.Append(staging.data(), staging.size()));
    }
  }
  return writer.Commit();
}

}  // namespace prl
