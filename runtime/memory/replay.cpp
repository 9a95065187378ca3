// Replayer (replay.h).
#include "runtime/memory/replay.h"

#include <algorithm>

#include <fmt/format.h>

namespace vcudnn::memory {

Replayer::Replayer(ReplayScript script) : script_(std::move(script)) {
  uint32_t allocs = 0;
  for (const ReplayStep& s : script_.steps) allocs += s.alloc ? 1 : 0;
  targets_of_alloc_.resize(allocs);
  for (uint32_t t = 0; t < script_.targets.size(); ++t) {
    const ReplayTarget& target = script_.targets[t];
    if (!target.persistent && target.alloc_index < allocs) targets_of_alloc_[target.alloc_index].push_back(t);
  }
  offload_of_.assign(script_.targets.size(), 0);
  for (uint32_t a = 0; a < script_.actions.size(); ++a) {
    order_.push_back(a);
    if (script_.actions[a].kind == ReplayAction::kOffload) offload_of_[script_.actions[a].target] = a;
  }
  slot_.assign(script_.targets.size(), nullptr);
  slot_serial_.assign(script_.targets.size(), 0);
  recent_.resize(script_.anchor);
}

void Replayer::bind_persistent(Buffer* b) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ReplayUses& u : script_.persistent_uses) {
    if (u.serial == b->serial) named_[b] = Named{&u.events, b->serial, true};
  }
  for (uint32_t t = 0; t < script_.targets.size(); ++t) {
    if (script_.targets[t].persistent && script_.targets[t].serial == b->serial) {
      slot_[t] = b;
      slot_serial_[t] = b->serial;
    }
  }
}

void Replayer::on_alloc(uint64_t bytes, std::vector<Due>& due) {
  std::lock_guard<std::mutex> lock(mu_);
  last_alloc_ = -1;
  const Seen s{true, bytes, nullptr, 0};
  on_event(&s, due);
}

int64_t Replayer::pending_allocation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_ ? last_alloc_ : -1;
}

void Replayer::bind(Buffer* b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!synced_) {  // kept with its step: the start of an iteration may be found later
    if (!recent_.empty() && recent_next_ > 0) {
      Seen& last = recent_[(recent_next_ - 1) % recent_.size()];
      if (last.alloc && !last.buffer) {
        last.buffer = b;
        last.serial = b->serial;
      }
    }
    return;
  }
  if (last_alloc_ >= 0) bind_allocation(static_cast<uint32_t>(last_alloc_), b);
  last_alloc_ = -1;
}

void Replayer::on_free(uint64_t bytes, std::vector<Due>& due) {
  std::lock_guard<std::mutex> lock(mu_);
  last_alloc_ = -1;
  const Seen s{false, bytes, nullptr, 0};
  on_event(&s, due);
}

void Replayer::on_use(std::vector<Due>& due) {
  std::lock_guard<std::mutex> lock(mu_);
  on_event(nullptr, due);
}

bool Replayer::synced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_;
}

ReplayStats Replayer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Replayer::late(uint32_t action) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.late_prefetches;
  if (action >= script_.actions.size()) return;
  ReplayAction& a = script_.actions[action];
  const uint32_t earliest = std::max(a.earliest, script_.actions[offload_of_[a.target]].event + 1);
  if (a.event <= earliest) return;
  a.event -= std::max<uint32_t>(1, (a.event - earliest) / 4);
  ++stats_.moved_earlier;
  reorder_ = true;
}

std::string Replayer::describe_mismatch(const Seen& seen) const {
  const auto text = [](bool alloc, uint64_t bytes) {
    return fmt::format("{} {:.2f} MiB", alloc ? "alloc" : "free", static_cast<double>(bytes) / (1 << 20));
  };
  std::string expected;
  for (size_t k = step_; k < script_.steps.size() && k < step_ + 3; ++k)
    expected += (expected.empty() ? "" : ", ") + text(script_.steps[k].alloc, script_.steps[k].bytes);
  return fmt::format("step {} of {} (event {}): {} where the script has {}", step_, script_.steps.size(), event_,
                     text(seen.alloc, seen.bytes), expected.empty() ? "no more steps" : expected);
}

bool Replayer::matches(size_t step, const Seen& s) const {
  return step < script_.steps.size() && script_.steps[step].alloc == s.alloc && script_.steps[step].bytes == s.bytes;
}

// One memory event: a step (allocation or free) or a use (`step` null).
void Replayer::on_event(const Seen* step, std::vector<Due>& due) {
  if (script_.anchor == 0 || script_.steps.empty()) return;
  if (!synced_) {
    if (step && after_first_mismatch_ > 0) {  // what came instead, for the log
      --after_first_mismatch_;
      stats_.first_mismatch +=
          fmt::format("{} {} {:.2f} MiB", after_first_mismatch_ == 5 ? "; then" : ",", step->alloc ? "alloc" : "free",
                      static_cast<double>(step->bytes) / (1 << 20));
    }
    if (step) look_for_start(*step);
    return;
  }
  if (step) {
    switch (place(*step)) {
      case Place::kExpected:
        break;
      case Place::kExtra:  // not in the script: passed over, the position unchanged
        ++stats_.extra_steps;
        return;
      case Place::kLost:
        if (stats_.mismatches++ == 0) {
          stats_.first_mismatch = describe_mismatch(*step);
          after_first_mismatch_ = 6;
        }
        lose();
        look_for_start(*step);
        return;
    }
    event_ = script_.steps[step_].event;  // the step says where the iteration is
  }
  fire(due);
  if (step) {
    if (step->alloc) last_alloc_ = allocs_++;
    ++step_;
  }
  if (++event_ >= script_.events) {
    if (step_ >= script_.steps.size()) {
      ++stats_.iterations;
      iterations_done_.store(stats_.iterations, std::memory_order_release);
      begin_iteration();
    } else {
      event_ = script_.events - 1;  // more uses than recorded: the remaining steps set the position
    }
  }
}

// Where a step seen while synced belongs (Note [Replaying an offload plan]): the one expected, one
// a few steps ahead (those between never came: the recorded iteration was the first, which
// allocates state once), the first of the next iteration (the last few never came), or none: a
// step the script does not have, passed over unless too many come in a row.
Replayer::Place Replayer::place(const Seen& s) {
  if (matches(step_, s)) {
    extras_in_row_ = 0;
    return Place::kExpected;
  }
  for (size_t k = 1; k <= kLookahead && step_ + k < script_.steps.size(); ++k) {
    if (!matches(step_ + k, s)) continue;
    for (size_t j = step_; j < step_ + k; ++j) allocs_ += script_.steps[j].alloc ? 1 : 0;
    stats_.skipped_steps += k;
    step_ += k;
    extras_in_row_ = 0;
    return Place::kExpected;
  }
  if (script_.steps.size() - step_ <= kLookahead && matches(0, s)) {
    stats_.skipped_steps += script_.steps.size() - step_;
    ++stats_.iterations;
    iterations_done_.store(stats_.iterations, std::memory_order_release);
    begin_iteration();
    extras_in_row_ = 0;
    return Place::kExpected;
  }
  return ++extras_in_row_ <= kLookahead ? Place::kExtra : Place::kLost;
}

void Replayer::fire(std::vector<Due>& due) {
  while (next_action_ < order_.size() && script_.actions[order_[next_action_]].event <= event_) {
    const uint32_t a = order_[next_action_++];
    const ReplayAction& action = script_.actions[a];
    Buffer* b = slot_[action.target];
    if (!b) continue;  // not named this iteration (found the start after its allocation)
    due.push_back({action.kind, b, slot_serial_[action.target], a});
    ++(action.kind == ReplayAction::kOffload ? stats_.offloads_due : stats_.prefetches_due);
  }
}

void Replayer::bind_allocation(uint32_t index, Buffer* b) {
  if (index >= targets_of_alloc_.size()) return;
  named_[b] = Named{&script_.alloc_uses[index], b->serial, false};
  for (uint32_t t : targets_of_alloc_[index]) {
    slot_[t] = b;
    slot_serial_[t] = b->serial;
  }
}

void Replayer::begin_iteration() {
  step_ = 0;
  event_ = 0;
  next_action_ = 0;
  allocs_ = 0;
  last_alloc_ = -1;
  for (uint32_t t = 0; t < slot_.size(); ++t) {
    if (!script_.targets[t].persistent) slot_[t] = nullptr;
  }
  std::erase_if(named_, [](const auto& kv) { return !kv.second.persistent; });
  if (reorder_) {
    std::stable_sort(order_.begin(), order_.end(), [&](uint32_t x, uint32_t y) {
      const ReplayAction &a = script_.actions[x], &b = script_.actions[y];
      return a.event != b.event ? a.event < b.event : a.kind < b.kind;
    });
    reorder_ = false;
  }
}

uint64_t Replayer::next_use_distance(const Buffer* b) const {
  const uint64_t n = script_.events;
  const auto it = named_.find(b);
  if (it == named_.end() || it->second.serial != b->serial) return n / 2;
  const std::vector<uint32_t>& uses = *it->second.uses;
  // event_ is the next event to come: a use there is still ahead.
  const auto next = std::lower_bound(uses.begin(), uses.end(), event_);
  if (next != uses.end()) return *next - event_;
  if (!it->second.persistent || uses.empty()) return 4 * n;  // not used again: only its free is ahead
  return n - event_ + uses.front();                          // next iteration
}

std::vector<Buffer*> Replayer::choose(std::vector<EvictionCandidate> candidates, uint64_t bytes) {
  std::vector<std::pair<uint64_t, size_t>> order;  // (distance, candidate)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < candidates.size(); ++i) order.push_back({next_use_distance(candidates[i].buffer), i});
  }
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return candidates[a.second].last_use < candidates[b.second].last_use;
  });
  std::vector<Buffer*> victims;
  uint64_t got = 0;
  for (const auto& [distance, i] : order) {
    if (got >= bytes) break;
    victims.push_back(candidates[i].buffer);
    got += candidates[i].bytes;
  }
  return victims;
}

void Replayer::lose() {
  synced_ = false;
  recent_next_ = 0;
  std::fill(recent_.begin(), recent_.end(), Seen{});
}

// While not synced: the last `anchor` steps seen, compared with the script's first ones.
void Replayer::look_for_start(const Seen& s) {
  const size_t n = script_.anchor;
  recent_[recent_next_ % n] = s;
  ++recent_next_;
  if (recent_next_ < n) return;
  for (size_t k = 0; k < n; ++k) {
    if (!matches(k, recent_[(recent_next_ + k) % n])) return;
  }
  // The anchor was the start of an iteration: follow it from the step after.
  synced_ = true;
  ++stats_.syncs;
  begin_iteration();
  for (size_t k = 0; k < n; ++k) {
    const Seen& seen = recent_[(recent_next_ + k) % n];
    if (!seen.alloc) continue;
    last_alloc_ = allocs_++;
    if (seen.buffer) bind_allocation(static_cast<uint32_t>(last_alloc_), seen.buffer);  // not the last one yet
  }
  if (!recent_[(recent_next_ + n - 1) % n].alloc) last_alloc_ = -1;
  step_ = n;
  event_ = script_.steps[n - 1].event + 1;
  // Actions before this point are for buffers of the steps just matched: their copies are not due
  // yet (an offload follows a use, which comes after these steps), or were missed; skip those past.
  while (next_action_ < order_.size() && script_.actions[order_[next_action_]].event < event_) ++next_action_;
}

}  // namespace vcudnn::memory
