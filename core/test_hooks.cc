#include "core/test_hooks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"

namespace prl {

namespace {

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

}  // namespace

void FaultPoint(absl::string_view name) {
  static const char* const armed = Env("PRL_FAULT_POINT");
  if (armed == nullptr || name != armed) return;
  const std::string line = absl::StrCat("prl fault point reached: ", name, "\n");
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  for (;;) ::pause();  // until the test's SIGKILL
}

void TapLine(absl::string_view name, absl::string_view line) {
  static const char* const dir = Env("PRL_TEST_TAP_DIR");
  if (dir == nullptr) return;
  const std::string path = absl::StrCat(dir, "/", name, ".tap");
  const std::string text = absl::StrCat(line, "\n");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  [[maybe_unused]] const ssize_t written = ::write(fd, text.data(), text.size());
  ::close(fd);
}

void ThrowPoint(absl::string_view name) {
  const char* armed = std::getenv("PRL_THROW_POINT");
  if (armed != nullptr && name == armed) {
    throw std::runtime_error(absl::StrCat("injected by PRL_THROW_POINT=", name));
  }
}

}  // namespace prl
