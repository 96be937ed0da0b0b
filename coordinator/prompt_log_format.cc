#include "coordinator/prompt_log_format.h"

#include <cstring>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/xxhash_inline.h"

namespace prl::coordinator::log_format {

namespace {

uint32_t HeaderCheck(const char* header) { return static_cast<uint32_t>(XXH3_64bits(header, 20)); }

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A layout-2 record at `at`, checked completely; `why` says what is wrong when !ok.
struct Probe {
  bool ok = false;
  uint64_t payload_bytes = 0;
  uint64_t batch_start = 0;
  const char* why = "";
};

Probe ProbeV2(absl::string_view c, uint64_t at) {
  Probe p;
  const uint64_t remaining = c.size() - at;
  if (remaining < kHeaderBytes) {
    p.why = "a partial header";
    return p;
  }
  const char* h = c.data() + at;
  if (Load<uint32_t>(h + 20) != HeaderCheck(h)) {
    p.why = "its header fails its check";
    return p;
  }
  p.payload_bytes = Load<uint32_t>(h + 16);
  p.batch_start = Load<uint64_t>(h + 8);
  if (p.payload_bytes > kMaxPayloadBytes || p.batch_start < kMagicBytes || p.batch_start > at) {
    p.why = "its header is out of range";
    return p;
  }
  if (kHeaderBytes + p.payload_bytes > remaining) {
    p.why = "its payload runs past the end of the file";
    return p;
  }
  if (XXH3_64bits(h + kHeaderBytes, p.payload_bytes) != Load<uint64_t>(h)) {
    p.why = "its payload fails its checksum";
    return p;
  }
  p.ok = true;
  return p;
}

// The first complete, valid record after offset `at`, and where it starts.
std::optional<std::pair<uint64_t, Probe>> FirstValidAfter(absl::string_view c, uint64_t at) {
  for (uint64_t p = at + 1; p + kHeaderBytes <= c.size(); ++p) {
    if (Load<uint32_t>(c.data() + p + 20) != HeaderCheck(c.data() + p)) continue;
    const Probe probe = ProbeV2(c, p);
    if (probe.ok) return std::make_pair(p, probe);
  }
  return std::nullopt;
}

absl::Status Unparsable(const std::string& path, uint64_t at) {
  return absl::DataLossError(
      absl::StrCat(path, ": record at byte ", at, " has a valid checksum but does not parse"));
}

absl::StatusOr<ReadLog> ReadV2(absl::string_view c, const std::string& path) {
  ReadLog out;
  uint64_t at = kMagicBytes;
  while (at < c.size()) {
    const Probe probe = ProbeV2(c, at);
    if (probe.ok) {
      prl::v1::LogRecord& record = out.records.emplace_back();
      if (!record.ParseFromArray(c.data() + at + kHeaderBytes,
                                 static_cast<int>(probe.payload_bytes))) {
        return Unparsable(path, at);
      }
      at += kHeaderBytes + probe.payload_bytes;
      continue;
    }
    const auto later = FirstValidAfter(c, at);
    if (later.has_value() && later->second.batch_start > at) {
      return absl::DataLossError(absl::StrCat(
          path, ": record at byte ", at, " is damaged (", probe.why,
          ") and a record committed after it follows at byte ", later->first,
          ": the log is corrupted, not torn by a crash; restore it, or move it aside to start "
          "with an empty log"));
    }
    out.torn_bytes = c.size() - at;
    break;
  }
  out.valid_bytes = at;
  return out;
}

absl::StatusOr<ReadLog> ReadV1(absl::string_view c, const std::string& path) {
  constexpr uint64_t kV1Header = 12;
  ReadLog out;
  out.layout = 1;
  uint64_t at = kMagicBytes;
  while (at < c.size()) {
    const uint64_t remaining = c.size() - at;
    uint32_t length = 0;
    bool torn = remaining < kV1Header;
    if (!torn) {
      length = Load<uint32_t>(c.data() + at);
      torn = length > kMaxPayloadBytes || kV1Header + length > remaining;
    }
    if (!torn &&
        XXH3_64bits(c.data() + at + kV1Header, length) != Load<uint64_t>(c.data() + at + 4)) {
      if (kV1Header + length != remaining) {
        return absl::DataLossError(absl::StrCat(path, ": record at byte ", at,
                                                " fails its checksum and is followed by more "
                                                "records: the log is corrupted"));
      }
      torn = true;
    }
    if (torn) {
      out.torn_bytes = remaining;
      break;
    }
    if (!out.records.emplace_back().ParseFromArray(c.data() + at + kV1Header,
                                                   static_cast<int>(length))) {
      return Unparsable(path, at);
    }
    at += kV1Header + length;
  }
  out.valid_bytes = at;
  return out;
}

}  // namespace

void AppendFramed(absl::string_view payload, uint64_t batch_start, std::string* out) {
  char header[kHeaderBytes];
  const uint64_t checksum = XXH3_64bits(payload.data(), payload.size());
  const auto bytes = static_cast<uint32_t>(payload.size());
  std::memcpy(header, &checksum, 8);
  std::memcpy(header + 8, &batch_start, 8);
  std::memcpy(header + 16, &bytes, 4);
  const uint32_t check = HeaderCheck(header);
  std::memcpy(header + 20, &check, 4);
  out->append(header, kHeaderBytes);
  out->append(payload.data(), payload.size());
}

absl::StatusOr<ReadLog> Read(absl::string_view contents, const std::string& path) {
  const absl::string_view magic = contents.substr(0, kMagicBytes);
  if (magic == kMagicV2) return ReadV2(contents, path);
  if (magic == kMagicV1) return ReadV1(contents, path);
  return absl::DataLossError(absl::StrCat(
      path, " is not a prl prompt log: expected the magic \"PRLLOG2\" (or \"PRLLOG1\"), found ",
      contents.size(), " bytes starting '", absl::CHexEscape(magic), "'"));
}

}  // namespace prl::coordinator::log_format
