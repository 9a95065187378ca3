// Free tags: where in a stream's order a piece of memory was last given back. Memory freed on
// stream S (cudaFreeAsync) may be reused at once by work ordered on S, by another stream only
// after that stream waits for the tag, and unmapped only once the tag is settled (the device has
// finished what was queued on S before the free). pool/ only stores and merges tags; what a
// stream and a sequence number mean, and whether a tag is settled, is the runtime's business
// (runtime/memory/stream_order.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace vcudnn::pool {

struct FreeTag {
  uint32_t stream = 0;  // the runtime's stream id; 0 is never used
  uint64_t seq = 0;     // a point in that stream's order
  bool operator==(const FreeTag&) const = default;
};

// At most one tag per stream: a later point in a stream's order covers every earlier one.
class TagSet {
 public:
  void add(FreeTag t) {
    if (t.stream == 0) return;
    for (FreeTag& mine : tags_) {
      if (mine.stream == t.stream) {
        mine.seq = std::max(mine.seq, t.seq);
        return;
      }
    }
    tags_.push_back(t);
  }
  void merge(const TagSet& other) {
    for (const FreeTag& t : other.tags_) add(t);
  }
  // Drops the tags `settled` says are done with.
  template <typename Settled>
  void prune(Settled&& settled) {
    tags_.erase(std::remove_if(tags_.begin(), tags_.end(), [&](const FreeTag& t) { return settled(t); }),
                tags_.end());
  }
  void clear() { tags_.clear(); }
  bool empty() const { return tags_.empty(); }
  const std::vector<FreeTag>& tags() const { return tags_; }

 private:
  std::vector<FreeTag> tags_;
};

}  // namespace vcudnn::pool
