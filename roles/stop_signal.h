// The stop flag of a long-running process: SIGINT and SIGTERM (Ctrl-C, `kubectl delete`,
// prl run's supervisor) set it, and every role's loop polls it and shuts down cleanly.
#pragma once

#include <atomic>

namespace prl::roles {

// Installs the handlers (idempotent) and returns the process's one stop flag.
const std::atomic<bool>& StopOnSignals();

}  // namespace prl::roles
