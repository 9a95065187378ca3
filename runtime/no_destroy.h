// NoDestroy<T>: a process-wide object that is constructed on first use and never destroyed, so
// that hooks and exit handlers running during process teardown still find it alive.
#pragma once

#include <new>
#include <utility>

namespace vcudnn {

template <typename T>
class NoDestroy {
 public:
  template <typename... Args>
  explicit NoDestroy(Args&&... args) {
    new (storage_) T(std::forward<Args>(args)...);
  }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }
  T* operator->() { return &get(); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace vcudnn
