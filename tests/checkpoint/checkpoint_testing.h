// Helpers for checkpoint tests: hand-made safetensors bytes (inputs WriteSafetensors would never
// produce: bad headers, other dtypes, extra tensors) and per-test scratch directories.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace prl::testing {

// An 8-byte little-endian `header_len`, then `header` verbatim, then `data`. `header_len` is
// normally header.size(); tests of the length check pass something else.
inline std::vector<uint8_t> SafetensorsBytes(uint64_t header_len, absl::string_view header,
                                             absl::Span<const uint8_t> data) {
  std::vector<uint8_t> bytes(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(header_len >> (8 * i));
  std::copy(header.begin(), header.end(), bytes.begin() + 8);
  std::copy(data.begin(), data.end(), bytes.begin() + 8 + header.size());
  return bytes;
}

// A file with `header` as its JSON and a data section of `data_bytes` bytes (0, 1, 2, ...).
inline std::vector<uint8_t> SafetensorsBytes(absl::string_view header, size_t data_bytes = 0) {
  std::vector<uint8_t> data(data_bytes);
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<uint8_t>(i);
  return SafetensorsBytes(header.size(), header, data);
}

// A tensor stored as raw bytes under any dtype name.
struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "I64", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline std::vector<uint8_t> F32Bytes(absl::Span<const float> values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A well-formed file holding `tensors` back to back, in the given order.
inline std::vector<uint8_t> SafetensorsBytes(const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<uint8_t> data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  const std::string text = header.dump();
  return SafetensorsBytes(text.size(), text, data);
}

inline void WriteBytes(const std::string& path, absl::Span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A fresh directory under ::testing::TempDir(), unique to the running test and process,
// removed with everything in it on destruction.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = absl::StrCat(::testing::TempDir(), "/prl_", test->test_suite_name(), "_", test->name(),
                         "_", getpid());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

}  // namespace prl::testing
