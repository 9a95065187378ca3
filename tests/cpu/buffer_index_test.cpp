// BufferIndex and the parameter scans: add/remove/overlap rules, interior pointers and the
// one-past-the-end boundary, the prefilter through removals, a fake kernel launch (scalars, plain
// pointers, a struct of pointers, untracked and interior pointers, duplicates, 4-byte params,
// broken layouts), a packed block, a random cross-check against a linear search, and readers
// racing a writer.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "pool/buffer_index.h"

namespace {

using vcudnn::pool::BufferIndex;
using vcudnn::pool::Hit;
using vcudnn::pool::ParamSlot;
using vcudnn::pool::scan_params;
using vcudnn::pool::scan_words;

constexpr uint64_t kBase = 0x7f0000000000ull;  // where device addresses tend to live
constexpr uint64_t kMiB = 1ull << 20;

}  // namespace

TEST_CASE("BufferIndex add, remove and overlap rejection", "[tracking]") {
  BufferIndex index;
  CHECK(index.size() == 0);
  CHECK_FALSE(index.find(kBase));
  REQUIRE(index.add(kBase, kMiB, 1));
  REQUIRE(index.add(kBase + 2 * kMiB, kMiB, 2));
  CHECK(index.size() == 2);

  CHECK_FALSE(index.add(kBase, kMiB, 3));               // same range
  CHECK_FALSE(index.add(kBase + kMiB / 2, kMiB, 3));    // starts inside 1
  CHECK_FALSE(index.add(kBase - 16, 32, 3));            // ends inside 1
  CHECK_FALSE(index.add(kBase - kMiB, 4 * kMiB, 3));    // covers both
  CHECK_FALSE(index.add(kBase + kMiB + 512, kMiB, 3));  // ends inside 2
  CHECK_FALSE(index.add(kBase + 2 * kMiB + 8, 8, 3));   // inside 2
  CHECK_FALSE(index.add(kBase + 5 * kMiB, 0, 3));       // empty
  CHECK_FALSE(index.add(UINT64_MAX - 15, 32, 3));       // wraps
  CHECK(index.size() == 2);
  CHECK_FALSE(index.find(kBase + kMiB / 2 + kMiB));  // the failed adds left nothing

  REQUIRE(index.add(kBase + kMiB, kMiB, 3));  // exactly fills the gap: touching is not overlapping
  REQUIRE(index.add(kBase - 64, 64, 4));      // ends exactly where 1 starts
  CHECK(index.size() == 4);
  CHECK(index.find(kBase + kMiB)->id == 3);
  CHECK(index.find(kBase - 1)->id == 4);

  CHECK_FALSE(index.remove(kBase + 8));  // not a start
  CHECK_FALSE(index.remove(kBase + 7 * kMiB));
  REQUIRE(index.remove(kBase + kMiB));
  CHECK_FALSE(index.remove(kBase + kMiB));  // twice
  CHECK(index.size() == 3);
  CHECK_FALSE(index.find(kBase + kMiB));
  CHECK_FALSE(index.find(kBase + kMiB + 100));
  REQUIRE(index.add(kBase + kMiB + 4096, 4096, 5));  // the freed range is reusable
  CHECK(index.find(kBase + kMiB + 4096 + 5) == Hit{5, kBase + kMiB + 4096, 5});
  CHECK(index.find(kBase + 2 * kMiB)->id == 2);
}

TEST_CASE("BufferIndex interior pointers and the one-past-the-end boundary", "[tracking]") {
  BufferIndex index;
  REQUIRE(index.add(kBase, 1000, 7));
  REQUIRE(index.add(kBase + 1000 + 24, 8, 8));  // a small neighbour after a 24-byte gap
  CHECK(index.find(kBase) == Hit{7, kBase, 0});
  CHECK(index.find(kBase + 1) == Hit{7, kBase, 1});
  CHECK(index.find(kBase + 999) == Hit{7, kBase, 999});
  CHECK_FALSE(index.find(kBase + 1000));  // one past the end
  CHECK_FALSE(index.find(kBase + 1023));
  CHECK(index.find(kBase + 1024) == Hit{8, kBase + 1024, 0});
  CHECK(index.find(kBase + 1031) == Hit{8, kBase + 1024, 7});
  CHECK_FALSE(index.find(kBase + 1032));
  CHECK_FALSE(index.find(kBase - 1));
  CHECK_FALSE(index.find(0));
  CHECK_FALSE(index.find(UINT64_MAX));

  BufferIndex top;  // a buffer that ends exactly at 2^64 - 1
  REQUIRE(top.add(UINT64_MAX - 15, 15, 1));
  CHECK(top.find(UINT64_MAX - 1) == Hit{1, UINT64_MAX - 15, 14});
  CHECK_FALSE(top.find(UINT64_MAX));
}

TEST_CASE("BufferIndex prefilter rejects far pointers and never misses after removals", "[tracking]") {
  BufferIndex index;
  CHECK(index.prefilter_min() > index.prefilter_max());  // empty: rejects everything
  REQUIRE(index.add(kBase + 10 * kMiB, kMiB, 1));
  REQUIRE(index.add(kBase + 20 * kMiB, kMiB, 2));
  REQUIRE(index.add(kBase + 30 * kMiB, kMiB, 3));
  CHECK(index.prefilter_min() == kBase + 10 * kMiB);
  CHECK(index.prefilter_max() == kBase + 31 * kMiB);
  CHECK_FALSE(index.find(0x1000));
  CHECK_FALSE(index.find(kBase));
  CHECK_FALSE(index.find(UINT64_MAX - 8));
  CHECK_FALSE(index.find(kBase + 31 * kMiB));

  REQUIRE(index.remove(kBase + 10 * kMiB));  // the lowest
  REQUIRE(index.remove(kBase + 30 * kMiB));  // the highest
  // Conservative is allowed; missing is not.
  CHECK(index.prefilter_min() <= kBase + 20 * kMiB);
  CHECK(index.prefilter_max() >= kBase + 21 * kMiB);
  CHECK(index.find(kBase + 20 * kMiB) == Hit{2, kBase + 20 * kMiB, 0});
  CHECK(index.find(kBase + 21 * kMiB - 1) == Hit{2, kBase + 20 * kMiB, kMiB - 1});
  CHECK_FALSE(index.find(kBase + 10 * kMiB));
  CHECK_FALSE(index.find(kBase + 30 * kMiB));

  // Grow again below and above the shrunk range.
  REQUIRE(index.add(kBase, 64, 4));
  REQUIRE(index.add(kBase + 40 * kMiB, 64, 5));
  CHECK(index.find(kBase + 63)->id == 4);
  CHECK(index.find(kBase + 40 * kMiB + 63)->id == 5);
  CHECK(index.find(kBase + 20 * kMiB + 5)->id == 2);

  REQUIRE(index.remove(kBase));
  REQUIRE(index.remove(kBase + 20 * kMiB));
  REQUIRE(index.remove(kBase + 40 * kMiB));
  CHECK(index.size() == 0);
  CHECK(index.prefilter_min() > index.prefilter_max());
  CHECK_FALSE(index.find(kBase + 20 * kMiB));
}

TEST_CASE("scan_params over a fake kernel launch", "[tracking]") {
  BufferIndex index;
  const uint64_t a = kBase, b = kBase + kMiB, c = kBase + 2 * kMiB, d = kBase + 3 * kMiB;
  REQUIRE(index.add(a, 4096, 10));
  REQUIRE(index.add(b, 4096, 11));
  REQUIRE(index.add(c, 4096, 12));
  REQUIRE(index.add(d, 4096, 13));

  // kernel(int n, float* x, Pair s, float* untracked, float* mid, float* x_again, int tracked_bits)
  struct Pair {
    uint64_t first;
    uint64_t second;
    int count;
  };
  static_assert(sizeof(Pair) == 24);
  int n = 1024;
  uint64_t x = a;
  Pair s{b + 8, c, 3};
  uint64_t untracked = kBase + 100 * kMiB;
  uint64_t mid = d + 2048;
  uint64_t x_again = a + 16;
  int32_t tracked_bits = 0;  // a 4-byte param: skipped even if its bits happened to match
  void* args[] = {&n, &x, &s, &untracked, &mid, &x_again, &tracked_bits};
  const std::vector<ParamSlot> layout = {{0, 4}, {8, 8}, {16, 24}, {40, 8}, {48, 8}, {56, 8}, {64, 4}};

  const auto hits = scan_params(index, layout, args);
  const std::vector<Hit> want = {{10, a, 0}, {11, b, 8}, {12, c, 0}, {13, d, 2048}};
  CHECK(hits == want);  // each buffer once, at its first hit, in parameter order

  SECTION("a struct's trailing partial word is not read") {
    std::vector<ParamSlot> short_struct = layout;
    short_struct[2].size = 12;  // only Pair::first fits in a whole word
    const auto h = scan_params(index, short_struct, args);
    const std::vector<Hit> w = {{10, a, 0}, {11, b, 8}, {13, d, 2048}};
    CHECK(h == w);
  }
  SECTION("a 4-byte parameter holding half a pointer is skipped") {
    uint32_t halves[2];
    std::memcpy(halves, &x, sizeof x);
    void* a2[] = {&halves[0]};
    CHECK(scan_params(index, {{0, 4}}, a2).empty());
    CHECK(scan_params(index, {{0, 8}}, a2) == std::vector<Hit>{{10, a, 0}});  // the control
  }
  SECTION("words are taken at 8-aligned offsets of the layout") {
    // A 16-byte parameter at layout offset 4: only its bytes [4, 12) form an aligned word.
    unsigned char raw[16] = {};
    std::memcpy(raw, &x, 8);      // bytes 0..7: not aligned in the layout, not read
    std::memcpy(raw + 4, &b, 8);  // bytes 4..11: layout offset 8
    void* a3[] = {raw};
    CHECK(scan_params(index, {{4, 16}}, a3) == std::vector<Hit>{{11, b, 0}});
    // x at bytes 0..7 and b at 8..15: both found at layout offset 0, neither at offset 4 (the
    // one aligned word there mixes their halves).
    unsigned char two[16];
    std::memcpy(two, &x, 8);
    std::memcpy(two + 8, &b, 8);
    void* a4[] = {two};
    CHECK(scan_params(index, {{0, 16}}, a4) == std::vector<Hit>{{10, a, 0}, {11, b, 0}});
    CHECK(scan_params(index, {{4, 16}}, a4).empty());
  }
  SECTION("null args and broken layouts do not crash") {
    CHECK(scan_params(index, layout, nullptr).empty());
    void* with_null[] = {&n, nullptr, &s, nullptr, nullptr, nullptr, nullptr};
    const auto h = scan_params(index, layout, with_null);
    CHECK(h == std::vector<Hit>{{11, b, 8}, {12, c, 0}});
    CHECK(scan_params(index, {}, args).empty());
    std::vector<ParamSlot> huge = {{0, 4}, {8, 1u << 30}};  // beyond CUDA's parameter limit
    CHECK(scan_params(index, huge, args).empty());
  }
  SECTION("nothing tracked") {
    BufferIndex empty;
    CHECK(scan_params(empty, layout, args).empty());
  }
}

TEST_CASE("scan_words over a packed parameter block", "[tracking]") {
  BufferIndex index;
  REQUIRE(index.add(kBase, 256, 1));
  REQUIRE(index.add(kBase + 4096, 256, 2));
  unsigned char block[44] = {};
  const uint64_t p0 = kBase + 4096 + 100, p1 = kBase + 8, p2 = kBase + 4096, p3 = kBase + 300;
  std::memcpy(block + 0, &p0, 8);
  std::memcpy(block + 8, &p1, 8);
  std::memcpy(block + 16, &p2, 8);  // a second pointer into buffer 2: reported once
  std::memcpy(block + 24, &p3, 8);  // just past buffer 1
  std::memcpy(block + 36, &p1, 8);  // not at a multiple of 8: not read
  CHECK(scan_words(index, block, sizeof block) == std::vector<Hit>{{2, kBase + 4096, 100}, {1, kBase, 8}});
  CHECK(scan_words(index, block + 8, 8) == std::vector<Hit>{{1, kBase, 8}});
  CHECK(scan_words(index, block, 7).empty());
  CHECK(scan_words(index, nullptr, 64).empty());
  // Read from an odd address: memcpy, no alignment assumed.
  alignas(8) unsigned char odd[17] = {};
  std::memcpy(odd + 1, &p1, 8);
  CHECK(scan_words(index, odd + 1, 8) == std::vector<Hit>{{1, kBase, 8}});
}

// More buffers than HitList keeps on the stack: every one reported once, in order, across the spill.
TEST_CASE("scan_words over a block naming more buffers than fit on the stack", "[tracking]") {
  BufferIndex index;
  constexpr size_t kBuffers = 3 * vcudnn::pool::HitList::kInline + 5;
  std::vector<uint64_t> words;
  std::vector<Hit> want;
  for (uint64_t i = 0; i < kBuffers; ++i) {
    REQUIRE(index.add(kBase + i * 4096, 1024, 100 + i));
    words.push_back(kBase + i * 4096 + i);
    words.push_back(kBase + i * 4096);  // a second pointer into the same buffer
    want.push_back({100 + i, kBase + i * 4096, i});
  }
  const auto hits = scan_words(index, words.data(), words.size() * 8);
  CHECK(hits.size() == kBuffers);
  CHECK(hits == want);
}

TEST_CASE("BufferIndex find agrees with a linear search on random buffers", "[tracking]") {
  std::mt19937_64 rng(20240604);
  struct Buf {
    uint64_t address, bytes, id;
  };
  std::vector<Buf> bufs;
  BufferIndex index;
  // 500 non-overlapping buffers: random sizes with random gaps (some zero: touching buffers).
  uint64_t at = kBase + (rng() % 4096);
  for (uint64_t id = 1; id <= 500; ++id) {
    at += (rng() % 4 == 0) ? 0 : rng() % 100000;
    const uint64_t bytes = 1 + rng() % 200000;
    bufs.push_back({at, bytes, id});
    at += bytes;
  }
  std::shuffle(bufs.begin(), bufs.end(), rng);  // added in random order
  for (const Buf& b : bufs) REQUIRE(index.add(b.address, b.bytes, b.id));
  REQUIRE(index.size() == 500);
  // Remove a tenth, so that holes exist where buffers were.
  for (int i = 0; i < 50; ++i) REQUIRE(index.remove(bufs[i].address));
  bufs.erase(bufs.begin(), bufs.begin() + 50);

  const uint64_t lo = kBase - 100000, hi = at + 100000;
  int hits = 0;
  for (int i = 0; i < 10000; ++i) {
    uint64_t p;
    switch (rng() % 4) {
      case 0: {  // near a buffer's edges
        const Buf& b = bufs[rng() % bufs.size()];
        const uint64_t choices[] = {b.address - 1, b.address, b.address + b.bytes - 1, b.address + b.bytes};
        p = choices[rng() % 4];
        break;
      }
      case 1:
        p = rng();  // anywhere
        break;
      default:
        p = lo + rng() % (hi - lo);
    }
    std::optional<Hit> want;
    for (const Buf& b : bufs)
      if (p >= b.address && p - b.address < b.bytes) want = Hit{b.id, b.address, p - b.address};
    const std::optional<Hit> got = index.find(p);
    INFO("pointer " << p);
    REQUIRE(got.has_value() == want.has_value());
    if (want) {
      REQUIRE(*got == *want);
      ++hits;
    }
  }
  CHECK(hits > 2000);  // the test exercised both answers
  CHECK(hits < 9000);
}

TEST_CASE("BufferIndex concurrent readers while a writer adds and removes", "[tracking]") {
  BufferIndex index;
  // Stable buffers that readers must always find, and churned ones the writer adds and removes.
  constexpr int kStable = 16, kChurn = 64;
  constexpr uint64_t kSlot = 1 << 16;  // each buffer's own slot: stable at even, churned at odd
  auto stable_address = [](int i) { return kBase + uint64_t(2 * i) * kSlot; };
  auto churn_address = [](int i) { return kBase + uint64_t(2 * i + 1) * kSlot; };
  auto churn_bytes = [](int i, uint64_t round) { return uint64_t(64 + ((i * 131 + round * 17) % 4000)); };
  for (int i = 0; i < kStable; ++i) REQUIRE(index.add(stable_address(i), kSlot / 2, 1000 + i));

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, reads{0}, churn_hits{0};
  auto reader = [&](unsigned seed) {
    std::mt19937_64 rng(seed);
    while (!stop.load(std::memory_order_relaxed)) {
      const int i = static_cast<int>(rng() % kStable);
      const uint64_t off = rng() % (kSlot / 2);
      const std::optional<Hit> s = index.find(stable_address(i) + off);
      if (!s || *s != Hit{uint64_t(1000 + i), stable_address(i), off}) ++bad;
      // A churned slot: either nothing, or a buffer with that slot's id and base, within the
      // largest size it is ever given.
      const int j = static_cast<int>(rng() % kChurn);
      const uint64_t p = churn_address(j) + rng() % 4064;
      if (const std::optional<Hit> h = index.find(p)) {
        ++churn_hits;
        if (h->id != uint64_t(j) || h->base != churn_address(j) || h->offset != p - churn_address(j)) ++bad;
      }
      if (index.find(stable_address(i) + kSlot / 2 + off)) ++bad;  // between buffers: never
      ++reads;
    }
  };
  std::vector<std::thread> readers;
  for (unsigned t = 0; t < 4; ++t) readers.emplace_back(reader, 100 + t);

  while (reads.load() < 100) std::this_thread::yield();  // the readers are running
  uint64_t writer_failures = 0;
  std::vector<bool> present(kChurn, false);
  // At least 2000 rounds, and on (in pairs, so that every churned buffer ends removed) until the
  // readers have seen churned buffers and read enough: under a parallel test run the scheduler may
  // keep them off the CPU for a while. 20 s at most.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (uint64_t round = 0;
       round < 2000 || round % 2 != 0 ||
       ((churn_hits.load() == 0 || reads.load() <= 1000) && std::chrono::steady_clock::now() < deadline);
       ++round) {
    for (int i = 0; i < kChurn; ++i) {
      if (present[i]) {
        writer_failures += !index.remove(churn_address(i));
      } else {
        writer_failures += !index.add(churn_address(i), churn_bytes(i, round), i);
      }
      present[i] = !present[i];
    }
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  CHECK(writer_failures == 0);
  CHECK(bad == 0);
  CHECK(reads > 1000);
  CHECK(churn_hits > 0);  // the readers saw churned buffers come and go
  CHECK(index.size() == kStable);
}
