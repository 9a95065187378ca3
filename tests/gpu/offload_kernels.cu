// Kernels of vcudnn_offload_client. The client embeds their PTX (kOffloadKernelsPtx in
// offload_client.cpp), so that building it needs no nvcc. After editing this file, regenerate with
//   /usr/local/cuda/bin/nvcc -ptx -arch=compute_80 -o /tmp/offload_kernels.ptx tests/gpu/offload_kernels.cu
// and paste the output into offload_client.cpp. The host twins (derive_host, fill_host) must match.
#include <stdint.h>

// The value fill_u32 writes at index i: a 32-bit mix, so every word differs from its neighbours.
__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// out[i] = in[i % n_in] * 2654435761 + salt: a pure function of the input the host can repeat.
extern "C" __global__ void derive_u32(const uint32_t* in, uint64_t n_in, uint32_t* out, uint64_t n_out, uint32_t salt) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_out; i += stride)
    out[i] = in[i % n_in] * 2654435761u + salt;
}

// out[i] = mix32(i ^ seed): data produced on the device, no upload.
extern "C" __global__ void fill_u32(uint32_t* out, uint64_t n, uint32_t seed) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = mix32(static_cast<uint32_t>(i) ^ seed);
}

// *acc ^= in[0] ^ ... ^ in[n-1]; xor is order-independent, so the result is exact.
extern "C" __global__ void xor_u32(const uint32_t* in, uint64_t n, uint32_t* acc) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint32_t x = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x ^= in[i];
  atomicXor(acc, x);
}
