// OpenBLAS chooses its kernels from a CPUID table when it is loaded. CPUs newer than that
// table (Emerald Rapids under Debian 12's OpenBLAS 0.3.21, for one) get the generic "Prescott"
// SSE3 kernels: SGEMM runs 3x slower. OPENBLAS_CORETYPE is OpenBLAS's documented override, but
// it is only read at load time, so a binary that detects the fallback re-executes itself with
// the variable set (SkylakeX where AVX-512 exists, else Haswell where AVX2 does).
#pragma once

namespace prl::kernels::cpu {

// Call first thing in main(). Returns normally when nothing needs doing: OpenBLAS recognised
// the CPU, OPENBLAS_CORETYPE is already set (the user's choice wins), the CPU lacks AVX2, or
// the re-exec failed (then the program simply runs with the slow kernels).
void ReexecWithTunedOpenBlasIfNeeded(char** argv);

// The kernel set OpenBLAS is using, e.g. "SkylakeX".
const char* OpenBlasCoreName();

}  // namespace prl::kernels::cpu
