#include "kernels/cpu/blas_tuning.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace prl::kernels::cpu {

const char* OpenBlasCoreName() { return openblas_get_corename(); }

void ReexecWithTunedOpenBlasIfNeeded(char** argv) {
#if defined(__x86_64__)
  if (getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with the slow kernels
  unsetenv("OPENBLAS_CORETYPE");
#else
  (void)argv;
#endif
}

}  // namespace prl::kernels::cpu
