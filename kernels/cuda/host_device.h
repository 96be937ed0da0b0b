// PRL_HOST_DEVICE marks a function that runs on the GPU and on the host: the device algorithms
// written this way (the sampler's Philox and its kept-set search) compile with the host
// compiler too, so CPU tests pin them against the CPU backend on machines without a GPU.
#pragma once

#if defined(__CUDACC__)
#define PRL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PRL_HOST_DEVICE inline
#endif
