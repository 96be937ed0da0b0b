#include "roles/stop_signal.h"

#include <signal.h>

namespace prl::roles {

namespace {
std::atomic<bool> stop_requested{false};
void RequestStop(int) { stop_requested = true; }
}  // namespace

const std::atomic<bool>& StopOnSignals() {
  struct sigaction action {};
  action.sa_handler = RequestStop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return stop_requested;
}

}  // namespace prl::roles
