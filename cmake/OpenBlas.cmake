# OpenBLAS, OpenMP build (Debian libopenblas-openmp-dev): inside our own OpenMP parallel
# regions it runs single-threaded instead of oversubscribing the cores, and outside them it
# uses all of them. Exposes the imported target prl::openblas.
find_path(PRL_OPENBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
  NO_DEFAULT_PATH)
find_library(PRL_OPENBLAS_LIBRARY openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
  NO_DEFAULT_PATH)
if(NOT PRL_OPENBLAS_INCLUDE_DIR OR NOT PRL_OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS (OpenMP build) not found: run scripts/setup.sh "
                      "(Debian package libopenblas-openmp-dev)")
endif()
add_library(prl::openblas INTERFACE IMPORTED)
target_include_directories(prl::openblas INTERFACE ${PRL_OPENBLAS_INCLUDE_DIR})
target_link_libraries(prl::openblas INTERFACE ${PRL_OPENBLAS_LIBRARY} OpenMP::OpenMP_CXX)
message(STATUS "prl: OpenBLAS ${PRL_OPENBLAS_LIBRARY}")
