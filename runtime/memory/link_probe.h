// The host link's bandwidths, measured once when memory ownership starts (startup.cpp) and written
// in every trace recorded after (planner/trace.h LinkBandwidth), so that plans are timed with this
// machine's link rather than an assumed one. Note [Measuring the host link] in link_probe.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "planner/trace.h"

namespace vcudnn::memory {

// Measures device-to-host, host-to-device and both at once on `out` and `in` (two streams of the
// current device), pinned host memory; nullopt when any CUDA call fails (logged). Never throws.
std::optional<LinkBandwidth> measure_link(cudaStream_t out, cudaStream_t in);

// What measure_link found for this process (set by startup.cpp), nullopt before or without it.
std::optional<LinkBandwidth> measured_link();
void set_measured_link(const LinkBandwidth& link);

}  // namespace vcudnn::memory
