// Backend descriptors vcudnn owns (backend_descriptor.h): entry points found once, every status
// checked and turned into an Error that names the call.
#include "runtime/backend_descriptor.h"

#include "runtime/decode_conv.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

template <typename Fn>
Fn resolve(const char* name) {
  return reinterpret_cast<Fn>(real_symbol(Library::kCudnn, name));
}

Error missing() { return Error{"the real cuDNN lacks the backend (graph-API) functions"}; }

}  // namespace

const RealBackend& real_backend() {
  static const RealBackend backend = [] {
    RealBackend b;
    b.create = resolve<decltype(b.create)>("cudnnBackendCreateDescriptor");
    b.destroy = resolve<decltype(b.destroy)>("cudnnBackendDestroyDescriptor");
    b.set = resolve<decltype(b.set)>("cudnnBackendSetAttribute");
    b.get = resolve<decltype(b.get)>("cudnnBackendGetAttribute");
    b.finalize = resolve<decltype(b.finalize)>("cudnnBackendFinalize");
    b.execute = resolve<decltype(b.execute)>("cudnnBackendExecute");
    b.last_error = resolve<decltype(b.last_error)>("cudnnGetLastErrorString");
    return b;
  }();
  return backend;
}

Error backend_error(const std::string& what, cudnnStatus_t status) {
  std::string message = what + " failed: " + cudnn_status_name(status);
  if (const auto last = real_backend().last_error) {
    char text[512] = {};
    last(text, sizeof text);
    if (text[0]) message += std::string(" (") + text + ")";
  }
  return Error{message};
}

cudnnStatus_t execute_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const int64_t (&uids)[3],
                           void* const (&pointers)[3], void* workspace) {
  const RealBackend& b = real_backend();
  if (!b.complete()) return CUDNN_STATUS_NOT_INITIALIZED;
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t st = b.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  st = b.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = b.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers);
  if (st == CUDNN_STATUS_SUCCESS)
    st = b.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = b.finalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) st = b.execute(handle, plan, pack);
  b.destroy(pack);
  return st;
}

Result<BackendDescriptor> BackendDescriptor::create(cudnnBackendDescriptorType_t type) {
  const RealBackend& b = real_backend();
  if (!b.complete()) return missing();
  cudnnBackendDescriptor_t d = nullptr;
  const cudnnStatus_t st = b.create(type, &d);
  if (st != CUDNN_STATUS_SUCCESS)
    return backend_error("cudnnBackendCreateDescriptor(" + std::to_string(type) + ")", st);
  return BackendDescriptor(d);
}

BackendDescriptor::~BackendDescriptor() {
  if (d_) real_backend().destroy(d_);
}

Status BackendDescriptor::set(const char* what, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              int64_t count, const void* elements) const {
  if (!d_) return Error{std::string("setting ") + what + " on no descriptor"};
  const cudnnStatus_t st = real_backend().set(d_, name, type, count, elements);
  if (st != CUDNN_STATUS_SUCCESS) return backend_error(std::string("setting ") + what, st);
  return ok_status();
}

Status BackendDescriptor::set_descriptor(const char* what, cudnnBackendAttributeName_t name,
                                         const BackendDescriptor& value) const {
  const cudnnBackendDescriptor_t v = value.get();
  return set(what, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

Status BackendDescriptor::finalize(const char* what) const {
  if (!d_) return Error{std::string("finalizing ") + what + ": no descriptor"};
  const cudnnStatus_t st = real_backend().finalize(d_);
  if (st != CUDNN_STATUS_SUCCESS) return backend_error(std::string("finalizing ") + what, st);
  return ok_status();
}

}  // namespace vcudnn
