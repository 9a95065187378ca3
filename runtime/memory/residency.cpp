// Residency (residency.h).
#include "runtime/memory/residency.h"

#include <algorithm>

#include "pool/placed_pool.h"

namespace vcudnn::memory {

Residency::Residency(pool::VmmArena& arena, pool::HostPool& host, Device& device, StreamOrder& order)
    : arena_(arena), host_(host), device_(device), order_(order) {
  out_id_ = order_.id_of(device_.out_stream());
  in_id_ = order_.id_of(device_.in_stream());
  // Note [Timing the waits for vcudnn's copies]
  order_.time_waits_on(out_id_);
  order_.time_waits_on(in_id_);
}

bool Residency::take_host_blocks(Buffer* b) {
  // A slab bounds one block, so a large buffer takes several.
  const uint64_t piece = host_.stats().slab_bytes;
  bool ok = piece != 0;
  for (uint64_t off = 0; ok && off < b->moving_bytes(); off += piece) {
    const auto block = host_.acquire(std::min(piece, b->moving_bytes() - off));
    if (block) b->host.push_back(*block);
    ok = block.has_value();
  }
  if (!ok) drop_host_copy(b);
  return ok;
}

void Residency::drop_host_copy(Buffer* b) {
  // A copy into these blocks may still be in flight: the next copy into them is queued behind it on
  // the out stream. A copy back from them may still be in flight: copies out wait for the last
  // copy back queued (start_eviction), and nothing else reads them.
  for (const pool::HostBlock& h : b->host) host_.release(h.ptr);
  b->host.clear();
}

std::vector<Buffer*> Residency::start_eviction(const std::vector<Buffer*>& victims) {
  std::vector<Buffer*> started;
  uint64_t streams = 0;
  for (Buffer* b : victims) {
    if (!take_host_blocks(b)) {
      ++stats_.no_host_memory;
      b->state.store(BufferState::kResident);
      continue;
    }
    streams |= b->streams.exchange(0);
    started.push_back(b);
  }
  if (started.empty()) return started;
  // The copies start after everything queued so far on every stream that used a victim, and after
  // the copies back that read host blocks these may reuse.
  const Stream transfer = device_.out_stream();
  bool ok = true;
  for (uint32_t id : order_.ids_in(streams)) ok = order_.order_after_queued(transfer, id) && ok;
  if (last_in_ && !order_.settled(*last_in_) && !order_.order(transfer, *last_in_)) order_.wait_host(*last_in_);
  bool fenced = false;  // the last copy queued ends with a fence of its own
  for (Buffer* b : started) {
    // Note [Copies out in pieces]: a placed buffer's bytes may change hands as they are read.
    b->copied_pieces.clear();
    b->piece_bytes = b->placed_pool ? piece_ : 0;
    const uint64_t piece = b->piece_bytes ? b->piece_bytes : UINT64_MAX;
    uint64_t off = 0;
    for (const pool::HostBlock& h : b->host) {
      const uint64_t n = std::min(h.bytes, b->moving_bytes() - off);
      for (uint64_t done = 0; ok && done < n;) {
        const uint64_t step = std::min(n - done, piece - (off + done) % piece);
        ok = device_.copy_to_host(static_cast<char*>(h.ptr) + done, b->moving_address() + off + done, step);
        done += step;
        fenced = false;
        if (b->piece_bytes && ((off + done) % piece == 0 || off + done == b->moving_bytes())) {
          b->copied_pieces.push_back(order_.mark(out_id_));
          order_.fence(out_id_);
          fenced = true;
        }
      }
      off += n;
    }
  }
  const pool::FreeTag end = fenced ? started.back()->copied_pieces.back() : order_.mark(out_id_);
  if (!fenced) order_.fence(out_id_);  // Note [Exact fences for vcudnn's copies]
  for (Buffer* b : started) {
    if (!ok) {
      drop_host_copy(b);
      b->state.store(BufferState::kResident);
      continue;
    }
    b->copied_out = end;
    ++stats_.started;
  }
  if (!ok) {
    ++stats_.failures;
    started.clear();
  }
  return started;
}

bool Residency::unmap(Buffer* b) {
  if (!b->placed_pool) return arena_.evict(b->address);
  pool::TagSet done;
  done.add(b->copied_out);
  return b->placed_pool->evict(b->placed_slot, b, done);
}

bool Residency::finish_eviction(Buffer* b) {
  if (b->state.load() != BufferState::kEvicting || !order_.settled(b->copied_out)) return false;
  if (b->placed_pool && !b->placed_pool->evict(b->placed_slot, b, [&] {
        pool::TagSet done;
        done.add(b->copied_out);
        return done;
      }())) {
    // The range stays mapped (a piece may be unmapped: the pool evicts again when asked); its bytes
    // are on the host too. Resident again unless part of it is gone.
    ++stats_.failures;
    if (b->placed_pool->is_mapped(b->placed_slot) && !b->handed_over) {
      drop_host_copy(b);
      b->state.store(BufferState::kResident);
      return false;
    }
    b->state.store(BufferState::kEvicted);
    ++stats_.evictions;
    return true;
  }
  if (!b->placed_pool && !arena_.evict(b->address)) {
    // Unmapped in part at most: map back what is missing; the bytes are still on the device or
    // were never touched by the failed unmap.
    if (arena_.is_evicted(b->address) && !arena_.restore(b->address)) {
      ++stats_.failures;
      b->state.store(BufferState::kEvicted);  // the host copy is complete: restore from it later
      ++stats_.evictions;
      return true;
    }
    ++stats_.failures;
    drop_host_copy(b);
    b->state.store(BufferState::kResident);
    return false;
  }
  b->state.store(BufferState::kEvicted);
  ++stats_.evictions;
  stats_.bytes_evicted += b->moving_bytes();
  return true;
}

void Residency::cancel_eviction(Buffer* b) {
  drop_host_copy(b);
  b->state.store(BufferState::kResident);
  ++stats_.cancelled;
}

bool Residency::resume_back(Buffer* b, std::optional<Stream> consumer, pool::TagSet waits,
                            std::vector<pool::TagSet>* by_piece) {
  if (b->state.load() != BufferState::kEvicting) return false;
  waits.add(b->copied_out);  // the copy back reads the host blocks the copy out fills
  if (by_piece) {
    // Piece k reads what the copy out's pieces up to its end wrote (Note [Copies out in pieces]).
    for (size_t k = 0; k < by_piece->size(); ++k) (*by_piece)[k].add(copied_up_to(*b, (k + 1) * piece_));
  }
  ++stats_.evictions;
  stats_.bytes_evicted += b->moving_bytes();
  b->state.store(BufferState::kEvicted);
  return copy_back(b, consumer, waits, by_piece);
}

bool Residency::restore(Buffer* b, std::optional<Stream> consumer) {
  if (!arena_.restore(b->address)) return false;
  return copy_back(b, consumer, {});
}

Residency::~Residency() {
  for (Event e : all_events_) device_.destroy_event(e);
}

Event Residency::timed_event() {
  if (!spare_events_.empty()) {
    const Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  const Event e = device_.create_timed_event();
  if (e) all_events_.push_back(e);
  return e;
}

std::vector<Residency::CopyTime> Residency::take_copy_times() {
  std::vector<CopyTime> out;
  while (!timings_.empty()) {
    const Timing& t = timings_.front();
    const EventState s = device_.query(t.end);
    if (s == EventState::kPending) break;
    if (s == EventState::kDone) {
      const std::optional<float> held = device_.elapsed_ms(t.pre, t.start);
      const std::optional<float> copy = device_.elapsed_ms(t.start, t.end);
      if (held && copy) out.push_back({t.bytes, *held, *copy});
    }
    spare_events_.insert(spare_events_.end(), {t.pre, t.start, t.end});
    timings_.pop_front();
  }
  return out;
}

bool Residency::copy_range_back(const Buffer* b, uint64_t lo, uint64_t hi) {
  uint64_t at = 0;  // where the host block starts in the moving part
  for (const pool::HostBlock& h : b->host) {
    const uint64_t from = std::max(lo, at), to = std::min(hi, at + h.bytes);
    if (from < to &&
        !device_.copy_to_device(b->moving_address() + from, static_cast<const char*>(h.ptr) + (from - at), to - from))
      return false;
    at += h.bytes;
    if (at >= hi) break;
  }
  return true;
}

bool Residency::copy_back(Buffer* b, std::optional<Stream> consumer, const pool::TagSet& waits,
                          const std::vector<pool::TagSet>* by_piece) {
  const Stream in = device_.in_stream();
  const uint64_t total = b->moving_bytes();
  const auto wait_for = [&](const pool::TagSet& tags) {
    for (const pool::FreeTag& t : tags.tags()) {
      if (!order_.settled(t) && !order_.order(in, t)) order_.wait_host(t);
    }
  };
  // Note [Copies back in pieces]: the pieces, in the order their holders finished.
  std::vector<std::pair<uint64_t, size_t>> pieces;  // (latest unsettled tag, piece)
  if (by_piece && !by_piece->empty() && piece_ && total > piece_) {
    const size_t n = static_cast<size_t>((total + piece_ - 1) / piece_);
    for (size_t k = 0; k < n; ++k) {
      uint64_t latest = 0;
      if (k < by_piece->size())
        for (const pool::FreeTag& t : (*by_piece)[k].tags())
          if (!order_.settled(t)) latest = std::max(latest, t.seq);
      pieces.emplace_back(latest, k);
    }
    std::stable_sort(pieces.begin(), pieces.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  // Note [Timing the waits for vcudnn's copies]; at most a few hundred copies back in flight timed.
  // In pieces, `start` is where the first piece's waits passed.
  Timing timing;
  const bool timed = time_back_ && timings_.size() < 256;
  if (timed) {
    timing = {timed_event(), timed_event(), timed_event(), total};
    if (timing.pre && !device_.record(timing.pre, in)) timing.pre = nullptr;
  }
  bool ok = true;
  if (pieces.empty()) {
    wait_for(waits);
    if (timed && timing.start && !device_.record(timing.start, in)) timing.start = nullptr;
    ok = copy_range_back(b, 0, total);
  } else {
    for (size_t i = 0; i < pieces.size() && ok; ++i) {
      const size_t k = pieces[i].second;
      if (k < by_piece->size()) wait_for((*by_piece)[k]);
      if (i == 0 && timed && timing.start && !device_.record(timing.start, in)) timing.start = nullptr;
      ok = copy_range_back(b, k * piece_, std::min(total, (k + 1) * piece_));
    }
    ++stats_.restores_in_pieces;
  }
  if (!ok) {
    for (Event e : {timing.pre, timing.start, timing.end})
      if (e) spare_events_.push_back(e);
    // The copies queued so far must finish before the memory can go again: keep it mapped, idle
    // of meaning, until then; the bytes are still on the host.
    order_.wait_host(order_.mark(in_id_));
    unmap(b);
    ++stats_.failures;
    return false;
  }
  if (timed) {
    if (timing.pre && timing.start && timing.end && device_.record(timing.end, in)) {
      timings_.push_back(timing);
    } else {
      for (Event e : {timing.pre, timing.start, timing.end})
        if (e) spare_events_.push_back(e);
    }
  }
  b->ready = order_.mark(in_id_);
  last_in_ = b->ready;
  order_.fence(in_id_);  // Note [Exact fences for vcudnn's copies]
  drop_host_copy(b);  // the next copy into these blocks queues behind the copy from them
  if (consumer) order_.order(*consumer, b->ready);
  b->restoring.store(true);
  b->state.store(BufferState::kResident);
  ++stats_.restores;
  stats_.bytes_restored += b->moving_bytes();
  return true;
}

}  // namespace vcudnn::memory
