#include "core/arena.h"

#include "core/status_macros.h"

namespace prl {

namespace {
constexpr size_t kAlignment = 64;
}

absl::Status Arena::Build(const std::function<void(Arena&)>& layout) {
  base_ = nullptr;
  offset_ = 0;
  layout(*this);
  const size_t needed = offset_;
  if (needed > buffer_.bytes()) {
    buffer_ = Buffer();  // free first: peak memory is the new size, not old + new
    PRL_ASSIGN_OR_RETURN(buffer_, Buffer::Allocate(device_, needed));
  }
  base_ = static_cast<char*>(buffer_.data());
  offset_ = 0;
  layout(*this);
  return absl::OkStatus();
}

size_t Arena::Measure(Device device, const std::function<void(Arena&)>& layout) {
  Arena arena(device);
  layout(arena);
  return arena.offset_;
}

Tensor Arena::Take(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(nullptr, dtype, device_, shape);
  offset_ = (offset_ + kAlignment - 1) / kAlignment * kAlignment;
  if (base_ != nullptr) t.data = base_ + offset_;
  offset_ += t.bytes();
  return t;
}

}  // namespace prl
