// Test hooks for the crash tests (tests/e2e/chaos_test.py), off unless their environment
// variables are set; a production run never sets them.
//
// PRL_FAULT_POINT=<name>: the first thread that reaches FaultPoint(<name>) writes
// "prl fault point reached: <name>" to stderr and stops there for good (the rest of the process
// runs on), so that a test kills the process (SIGKILL) in exactly that window: e.g. after an
// actor wrote a group to the replay buffer and before the coordinator heard of it.
//
// PRL_TEST_TAP_DIR=<dir>: TapLine(<name>, line) appends the line to <dir>/<name>.tap with one
// write (lines are short: whole lines from several processes never interleave), so that a
// test has an oracle of what the processes did that is not their own bookkeeping: e.g. every
// group the actors wrote, against the coordinator's state and the learner's ledger.
//
// PRL_THROW_POINT=<name>: ThrowPoint(<name>) throws std::runtime_error, so that a test injects
// a handler's bug where it cannot reach the handler's code (the no-throw boundary of every
// server, rpc/grpc_util.h: Guarded). Read at every call: a test may set it in-process.
//
// Thread-safety: all may be called from any thread.
#pragma once

#include "absl/strings/string_view.h"

namespace prl {

void FaultPoint(absl::string_view name);
void TapLine(absl::string_view name, absl::string_view line);
void ThrowPoint(absl::string_view name);

}  // namespace prl
