// Arena: lays tensors out back to back (64-byte aligned) in one Buffer, for activations and
// scratch whose shapes depend on the batch. Usage: a layout function takes the arena and calls
// Take() for every tensor; Arena::Build runs it once to measure and once, after allocating, to
// bind the views. The buffer only grows, so steady-state batches allocate nothing.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace prl {

class Arena {
 public:
  explicit Arena(Device device) : device_(device) {}

  // Runs `layout` to size and bind its tensors; reallocates only if the buffer is too small.
  absl::Status Build(const std::function<void(Arena&)>& layout);

  // During layout: the next tensor. Before the buffer exists the view's data is null.
  Tensor Take(DType dtype, std::initializer_list<int64_t> shape);

  // The bytes `layout` takes, without allocating (the views it binds have null data).
  static size_t Measure(Device device, const std::function<void(Arena&)>& layout);

  size_t capacity_bytes() const { return buffer_.bytes(); }
  // The bytes the last Build's layout took (<= capacity_bytes()).
  size_t laid_out_bytes() const { return offset_; }
  Device device() const { return device_; }

 private:
  Device device_;
  Buffer buffer_;
  char* base_ = nullptr;
  size_t offset_ = 0;
};

}  // namespace prl
