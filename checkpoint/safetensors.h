// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON describing every tensor (dtype, shape, byte range within the
// data section) plus optional string metadata, then the raw little-endian data.
//
// The parser treats the file as untrusted input: a truncated file, a header length past the
// end, malformed or deeply nested JSON, unknown dtypes or keys, duplicate names, sizes that
// disagree with shape and dtype, ranges out of the data section and overlapping ranges are all
// errors naming the file and the tensor. It is fuzzed (fuzz/safetensors_header_fuzzer.cc).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/mapped_file.h"

namespace prl {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as spelled in the file: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range [begin, end) within the data section
  uint64_t end = 0;

  int64_t numel() const;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;               // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;                 // bytes of the data section
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::vector<std::pair<std::string, std::string>> metadata;

  const SafetensorsEntry* Find(absl::string_view name) const;
};

// Largest header accepted (the reference implementation's limit is 100 MB as well).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates the header of a safetensors file whose complete contents are `file`.
// `source` (a path) prefixes error messages.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::Span<const uint8_t> file,
                                                         absl::string_view source);

// Size in bytes of one element of a safetensors dtype name, 0 if the name is unknown.
size_t SafetensorsDTypeSize(absl::string_view dtype);

// A memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return file_.path(); }
  // The raw bytes of a tensor of this file.
  absl::Span<const uint8_t> Data(const SafetensorsEntry& entry) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// A tensor to write: fp32 source data, stored in the file as `dtype` (F32, BF16 or F16).
struct SafetensorsTensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel(shape) floats
};

// Writes a safetensors file atomically (temporary file + rename), tensors in name order,
// header padded with spaces to a multiple of 8 bytes as the reference implementation does.
absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsTensorToWrite> tensors, DType dtype,
                              const std::vector<std::pair<std::string, std::string>>& metadata);

// The file size WriteSafetensors would produce (for sharding decisions).
uint64_t SafetensorsDataBytes(absl::Span<const SafetensorsTensorToWrite> tensors, DType dtype);

}  // namespace prl
