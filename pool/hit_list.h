// HitList: the buffers one call touches, as found by the index. Most calls touch a handful, so the
// first kInline live on the stack and only a call touching more allocates (a launch used to
// allocate up to three times while its vector grew: a third of its tracking cost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

namespace vcudnn::pool {

struct Hit {
  uint64_t id = 0;      // the buffer's id, as given to BufferIndex::add()
  uint64_t base = 0;    // the buffer's address
  uint64_t offset = 0;  // pointer - base
  bool operator==(const Hit&) const = default;
};

class HitList {
 public:
  static constexpr size_t kInline = 16;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const Hit* begin() const { return data(); }
  const Hit* end() const { return data() + size_; }
  const Hit& operator[](size_t i) const { return data()[i]; }
  void reserve(size_t n) {
    if (n > kInline) spill(n);
  }
  // May throw std::bad_alloc past kInline entries.
  void push_back(const Hit& h) {
    if (heap_.empty() && size_ < kInline) {
      new (inline_ + size_ * sizeof(Hit)) Hit(h);
      ++size_;
      return;
    }
    if (heap_.empty()) spill(2 * kInline);
    heap_.push_back(h);
    ++size_;
  }
  // Whether a buffer with this id is in the list already.
  bool contains(uint64_t id) const {
    for (const Hit& h : *this)
      if (h.id == id) return true;
    return false;
  }
  bool operator==(const std::vector<Hit>& other) const {
    if (other.size() != size_) return false;
    for (size_t i = 0; i < size_; ++i)
      if (!((*this)[i] == other[i])) return false;
    return true;
  }

 private:
  const Hit* stack() const { return std::launder(reinterpret_cast<const Hit*>(inline_)); }
  const Hit* data() const { return heap_.empty() ? stack() : heap_.data(); }
  void spill(size_t capacity) {
    if (!heap_.empty()) return heap_.reserve(capacity);
    heap_.reserve(capacity);
    heap_.assign(stack(), stack() + size_);
  }

  // Raw storage: the entries in use are constructed by push_back (Hit is trivially copyable and
  // destructible), so an empty list costs no initialisation.
  static_assert(std::is_trivially_copyable_v<Hit> && std::is_trivially_destructible_v<Hit>);
  alignas(Hit) unsigned char inline_[kInline * sizeof(Hit)];
  std::vector<Hit> heap_;  // in use once non-empty
  size_t size_ = 0;
};

}  // namespace vcudnn::pool
