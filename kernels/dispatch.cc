#include "kernels/dispatch.h"

#include "absl/strings/str_join.h"

namespace prl::kernels::internal {

Device CommonDevice(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    PRL_CHECK(t->device == first->device, op, ": tensors on ", first->device.ToString(), " and ",
              t->device.ToString());
  }
  PRL_CHECK(first != nullptr, op, ": no tensor given");
  return first->device;
}

void ExpectTensor(const char* op, const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> shape) {
  PRL_CHECK(t.defined(), op, ": ", name, " is undefined");
  PRL_CHECK(t.dtype == dtype, op, ": ", name, " has dtype ", DTypeName(t.dtype), ", expected ",
            DTypeName(dtype));
  bool same = static_cast<int>(shape.size()) == t.rank;
  int i = 0;
  for (int64_t d : shape) {
    if (same && t.dims[i] != d) same = false;
    ++i;
  }
  PRL_CHECK(same, op, ": ", name, " has shape ", t.ShapeString(), ", expected (",
            absl::StrJoin(shape, ", "), ")");
}

void NoBackend(const char* op, Device device) {
  PRL_CHECK(false, op, ": no kernel for device ", device.ToString(), " in this build");
  __builtin_unreachable();
}

}  // namespace prl::kernels::internal
