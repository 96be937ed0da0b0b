// libFuzzer target for the safetensors header parser, which reads untrusted files.
//
// Beyond "no crash, no sanitizer report, no hang", every accepted header must satisfy the
// parser's documented guarantees: tensors sorted by unique name, each byte range inside the
// data section, sized exactly shape x dtype, and no two non-empty ranges overlapping.
// Built with clang by scripts/fuzz.sh; the same entry point replays fuzz/corpus/ in ctest.
#include <cstdint>
#include <cstdlib>

#include "checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<prl::SafetensorsHeader> header =
      prl::ParseSafetensorsHeader(absl::Span<const uint8_t>(data, size), "fuzz-input");
  if (!header.ok()) {
    if (header.status().message().empty()) std::abort();  // errors must explain themselves
    return 0;
  }
  if (header->data_offset + header->data_size != size) std::abort();
  const prl::SafetensorsEntry* previous = nullptr;
  for (const prl::SafetensorsEntry& e : header->tensors) {
    if (previous != nullptr && !(previous->name < e.name)) std::abort();
    if (e.begin > e.end || e.end > header->data_size) std::abort();
    const uint64_t bytes = static_cast<uint64_t>(e.numel()) * prl::SafetensorsDTypeSize(e.dtype);
    if (bytes != e.end - e.begin) std::abort();
    for (const prl::SafetensorsEntry& other : header->tensors) {
      if (&other == &e || e.begin == e.end || other.begin == other.end) continue;
      if (e.begin < other.end && other.begin < e.end) std::abort();
    }
    previous = &e;
  }
  return 0;
}
