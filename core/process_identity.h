// A process's identity across time: its pid plus its start time, so that a reused pid is not
// mistaken for the process that held a lock or a lease in shared memory.
//
// Token layout (64 bits): pid in the low 22 bits (Linux's PID_MAX_LIMIT is 2^22), the start
// time in clock ticks since boot (/proc/<pid>/stat field 22) in the high 42 bits. 0 is never a
// valid token.
#pragma once

#include <cstdint>

namespace prl {

using ProcessToken = uint64_t;

// This process's token (computed once).
ProcessToken SelfProcessToken();
// The pid of a token.
inline int32_t TokenPid(ProcessToken token) { return static_cast<int32_t>(token & 0x3fffff); }
// True while the process of the token runs (the pid exists with the same start time). A zombie
// (exited, not yet reaped) counts as dead.
bool ProcessAlive(ProcessToken token);

}  // namespace prl
