// Graph-API (backend) descriptors that vcudnn builds itself: the real cuDNN backend entry points
// (resolved from the real library like every real() call, so our own descriptors never pass
// through our hooks nor show in the BackendShadow) and an owning handle that destroys its
// descriptor on every path.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>
#include <utility>

#include "planner/result.h"

namespace vcudnn {

// The backend functions of the real cuDNN; a member is null when the library lacks it.
struct RealBackend {
  decltype(&::cudnnBackendCreateDescriptor) create = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) destroy = nullptr;
  decltype(&::cudnnBackendSetAttribute) set = nullptr;
  decltype(&::cudnnBackendGetAttribute) get = nullptr;
  decltype(&::cudnnBackendFinalize) finalize = nullptr;
  decltype(&::cudnnBackendExecute) execute = nullptr;
  decltype(&::cudnnGetLastErrorString) last_error = nullptr;  // optional: only improves messages

  bool complete() const { return create && destroy && set && get && finalize && execute; }
};
const RealBackend& real_backend();

// "<what> failed: CUDNN_STATUS_... (cuDNN's last error message, when it has one)".
Error backend_error(const std::string& what, cudnnStatus_t status);

// Runs `plan` on the handle's stream with a variant pack of its own: `uids` and `pointers` (x, w, y
// in any order the plan's tensors were given) and the workspace. The pack is made, used and
// destroyed here (the execution is enqueued with the pointers' values). cuDNN's status.
cudnnStatus_t execute_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const int64_t (&uids)[3],
                           void* const (&pointers)[3], void* workspace);

// Owns one backend descriptor. Move-only; move-assignment swaps, so the descriptor held before
// is destroyed with the moved-from object.
class BackendDescriptor {
 public:
  BackendDescriptor() = default;
  static Result<BackendDescriptor> create(cudnnBackendDescriptorType_t type);
  ~BackendDescriptor();
  BackendDescriptor(BackendDescriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  BackendDescriptor& operator=(BackendDescriptor&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }

  // Each names `what` (the attribute) in its error.
  Status set(const char* what, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
             const void* elements) const;
  Status set_descriptor(const char* what, cudnnBackendAttributeName_t name, const BackendDescriptor& value) const;
  Status finalize(const char* what) const;

 private:
  explicit BackendDescriptor(cudnnBackendDescriptor_t d) : d_(d) {}
  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace vcudnn
