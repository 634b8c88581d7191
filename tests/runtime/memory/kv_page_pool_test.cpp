// KV page pool: exact byte accounting, all-or-nothing admission and growth, block tables and slots,
// layer memory. Generation-agnostic: geometries here are plain numbers.
#include "runtime/memory/kv_page_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace genbridge::runtime {
namespace {

// 4 layers, 8 kv heads, pages of 128 tokens, rows of 128 bytes plus a 2-byte side entry (the shape of an
// int8 + fp16-scale cache at head_dim 128: 130 bytes per (token, kv head)).
KvPageGeometry geometry() { return {4, 8, 128, 128, 2}; }

TEST(KvPagePool, exact_byte_accounting) {
  const KvPageGeometry g = geometry();
  EXPECT_EQ(g.bytes_per_token(), 4 * 2 * 8 * 130);
  EXPECT_EQ(g.bytes_per_page(), 4 * 2 * 8 * 130 * 128);
  auto pool = KvPagePool::create(g, 10);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_EQ(pool->total_bytes(), 10 * 128 * 4 * 2 * 8 * 130);
  EXPECT_EQ(pool->bytes_in_use(), 0);
  ASSERT_TRUE(pool->admit(1, 129).ok());  // 2 pages
  EXPECT_EQ(pool->used_pages(), 2);
  EXPECT_EQ(pool->bytes_in_use(), 2 * g.bytes_per_page());
  EXPECT_EQ(pool->free_pages(), 8);
  // A packed geometry without side caches (fp8 + fp32 scale in the row: 132 bytes).
  auto packed = KvPagePool::create({2, 4, 128, 132, 0}, 3);
  ASSERT_TRUE(packed.ok());
  EXPECT_EQ(packed->total_bytes(), 3 * 128 * 2 * 2 * 4 * 132);
  EXPECT_EQ(packed->layer(1).key_side, nullptr);
}

TEST(KvPagePool, budget_sizes_whole_pages) {
  const KvPageGeometry g = geometry();
  auto pool = KvPagePool::create_for_budget(g, 5 * g.bytes_per_page() + g.bytes_per_page() - 1);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_pages(), 5);
  auto none = KvPagePool::create_for_budget(g, g.bytes_per_page() - 1);
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(
      none.status().message(),
      "kv page pool: a budget of 1064959 bytes holds no page of 1064960 bytes (128 tokens x 8320 bytes per token)");
}

TEST(KvPagePool, admission_refuses_what_it_cannot_hold_and_changes_nothing) {
  auto pool = KvPagePool::create(geometry(), 4).value();
  ASSERT_TRUE(pool.admit(1, 300).ok());  // 3 pages
  EXPECT_FALSE(pool.can_admit(129));
  const Status st = pool.admit(2, 129);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "kv page pool: sequence 2 (129 tokens) needs 2 more pages of 128 tokens but only 1 of 4 pages are free "
            "(1.02 MiB per page)");
  EXPECT_FALSE(pool.contains(2));
  EXPECT_EQ(pool.free_pages(), 1);
  // A reservation counts too.
  EXPECT_FALSE(pool.can_admit(1, 200));
  EXPECT_EQ(pool.admit(3, 1, 200).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(pool.contains(3));
  EXPECT_TRUE(pool.can_admit(128));
  EXPECT_TRUE(pool.admit(3, 128).ok());
  EXPECT_EQ(pool.free_pages(), 0);
}

TEST(KvPagePool, append_is_all_or_nothing) {
  auto pool = KvPagePool::create(geometry(), 3).value();
  ASSERT_TRUE(pool.admit(1, 100).ok());
  ASSERT_TRUE(pool.admit(2, 200).ok());  // all 3 pages used
  ASSERT_TRUE(pool.append(1, 28).ok());  // fills page 0 exactly
  EXPECT_EQ(pool.length(1), 128);
  const std::vector<int32_t> table(pool.block_table(1).begin(), pool.block_table(1).end());
  const Status st = pool.append(1, 1);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "kv page pool: sequence 1 (growing from 128 to 129 tokens) needs 1 more page of 128 tokens but only 0 of 3 "
            "pages are free (1.02 MiB per page)");
  EXPECT_EQ(pool.length(1), 128);
  EXPECT_EQ(std::vector<int32_t>(pool.block_table(1).begin(), pool.block_table(1).end()), table);
  ASSERT_TRUE(pool.release(2).ok());
  EXPECT_TRUE(pool.append(1, 1).ok());
  EXPECT_EQ(pool.block_table(1).size(), 2u);
}

TEST(KvPagePool, reservation_makes_appends_free) {
  auto pool = KvPagePool::create(geometry(), 4).value();
  ASSERT_TRUE(pool.admit(7, 10, 300).ok());
  EXPECT_EQ(pool.used_pages(), 3);
  EXPECT_EQ(pool.capacity(7), 384);
  for (int i = 0; i < 290; ++i) ASSERT_TRUE(pool.append(7, 1).ok());
  EXPECT_EQ(pool.used_pages(), 3);
  EXPECT_EQ(pool.length(7), 300);
}

// A sequence admitted with a reservation owns every reserved page from the start, so its block table is
// wider than its length needs: table rows must be as wide as the pages owned (rows sized from the
// length failed with the message below as soon as a request's reservation spanned a second page).
TEST(KvPagePool, block_table_of_a_sequence_owning_more_pages_than_its_length_needs) {
  auto pool = KvPagePool::create(geometry(), 8).value();
  ASSERT_TRUE(pool.admit(5, 1).ok());       // page 0
  ASSERT_TRUE(pool.admit(1, 1, 300).ok());  // 1 token, pages 1, 2, 3
  EXPECT_EQ(pool.length(1), 1);
  EXPECT_EQ(pool.pages_for(pool.length(1)), 1);
  const std::vector<int32_t> owned(pool.block_table(1).begin(), pool.block_table(1).end());
  EXPECT_EQ(owned, (std::vector<int32_t>{1, 2, 3}));

  const std::vector<SeqId> ids = {5, 1};
  std::vector<int32_t> table(2 * 4, 99);
  const Status narrow = pool.fill_block_tables(ids, pool.pages_for(pool.length(1)), table);
  EXPECT_EQ(narrow.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(narrow.message(), "kv page pool: sequence 1 holds 3 pages but the table rows have 1 entries");
  EXPECT_EQ(table, std::vector<int32_t>(8, 99)) << "nothing written on error";
  ASSERT_TRUE(pool.fill_block_tables(ids, 3, table).ok());
  EXPECT_EQ(std::vector<int32_t>(table.begin(), table.begin() + 6), (std::vector<int32_t>{0, -1, -1, 1, 2, 3}));

  // Growing into the reservation takes no page and keeps the table; positions land on the owned pages.
  ASSERT_TRUE(pool.append(1, 299).ok());
  EXPECT_EQ(std::vector<int32_t>(pool.block_table(1).begin(), pool.block_table(1).end()), owned);
  EXPECT_EQ(pool.used_pages(), 4);
  std::vector<int64_t> slots(3);
  ASSERT_TRUE(pool.slots(1, 127, 130, slots).ok());
  EXPECT_EQ(slots, (std::vector<int64_t>{1 * 128 + 127, 2 * 128, 2 * 128 + 1}));
  ASSERT_TRUE(pool.slots(1, 299, 300, slots).ok());
  EXPECT_EQ(slots[0], 3 * 128 + 43);
}

TEST(KvPagePool, block_tables_slots_and_page_reuse) {
  auto pool = KvPagePool::create(geometry(), 6).value();
  ASSERT_TRUE(pool.admit(1, 130).ok());   // pages 0, 1
  ASSERT_TRUE(pool.admit(2, 5).ok());     // page 2
  ASSERT_TRUE(pool.append(1, 200).ok());  // 330 tokens: page 3 added
  EXPECT_EQ(std::vector<int32_t>(pool.block_table(1).begin(), pool.block_table(1).end()),
            (std::vector<int32_t>{0, 1, 3}));
  std::vector<int64_t> slots(4);
  ASSERT_TRUE(pool.slots(1, 126, 130, slots).ok());
  EXPECT_EQ(slots, (std::vector<int64_t>{126, 127, 128, 129}));
  ASSERT_TRUE(pool.slots(1, 256, 258, slots).ok());
  EXPECT_EQ(slots[0], 3 * 128);
  EXPECT_EQ(slots[1], 3 * 128 + 1);
  ASSERT_TRUE(pool.slots(2, 0, 1, slots).ok());
  EXPECT_EQ(slots[0], 2 * 128);

  std::vector<int32_t> table(2 * 4, 99);
  const std::vector<SeqId> ids = {2, 1};
  ASSERT_TRUE(pool.fill_block_tables(ids, 4, table).ok());
  EXPECT_EQ(table, (std::vector<int32_t>{2, -1, -1, -1, 0, 1, 3, -1}));

  // Freed pages go back and the next sequence reuses them in the same order.
  ASSERT_TRUE(pool.release(1).ok());
  EXPECT_FALSE(pool.contains(1));
  EXPECT_EQ(pool.length(1), 0);
  EXPECT_TRUE(pool.block_table(1).empty());
  ASSERT_TRUE(pool.admit(3, 384).ok());
  EXPECT_EQ(std::vector<int32_t>(pool.block_table(3).begin(), pool.block_table(3).end()),
            (std::vector<int32_t>{0, 1, 3}));
}

TEST(KvPagePool, invalid_requests) {
  auto pool = KvPagePool::create(geometry(), 2).value();
  ASSERT_TRUE(pool.admit(1, 10).ok());
  auto expect = [](const Status& st, const std::string& msg) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), msg);
  };
  expect(pool.admit(1, 5), "kv page pool: sequence 1 is already admitted");
  expect(pool.admit(2, -1), "kv page pool: sequence 2 asks for -1 tokens (0 reserved); counts must be >= 0");
  expect(pool.append(9, 1), "kv page pool: sequence 9 is not admitted");
  expect(pool.append(1, -2), "kv page pool: sequence 1 cannot grow by -2 tokens; counts must be >= 0");
  expect(pool.release(9), "kv page pool: sequence 9 is not admitted");
  std::vector<int64_t> slots(20);
  expect(pool.slots(1, 5, 11, slots), "kv page pool: positions [5, 11) are not within sequence 1's 10 tokens");
  expect(pool.slots(1, 0, 10, std::span<int64_t>(slots).first(3)),
         "kv page pool: 10 slots do not fit in an output of 3");
  std::vector<int32_t> table(4);
  const std::vector<SeqId> ids = {1, 4};
  expect(pool.fill_block_tables(ids, 2, table), "kv page pool: sequence 4 is not admitted");
  expect(pool.fill_block_tables(ids, 3, table), "kv page pool: a table of 4 entries cannot hold 2 rows of 3 blocks");
  const std::vector<SeqId> one = {1};
  expect(pool.fill_block_tables(one, 0, table),
         "kv page pool: sequence 1 holds 1 pages but the table rows have 0 entries");
  auto bad = KvPagePool::create({4, 0, 128, 128, 2}, 2);
  expect(bad.status(),
         "kv page pool: geometry (num_layers 4, num_kv_heads 0, page_size 128, row_bytes 128, side_row_bytes 2) is "
         "invalid; every field must be >= 1 except side_row_bytes >= 0");
  expect(KvPagePool::create(geometry(), -1).status(), "kv page pool: num_pages is -1 but must be in [0, 2^31)");
}

// Every layer's four buffers are distinct, fully writable (the sanitizer build checks the bounds) and
// exactly as large as the layout says.
TEST(KvPagePool, layer_memory_is_separate_and_complete) {
  const KvPageGeometry g = {3, 2, 16, 64, 2};
  auto pool = KvPagePool::create(g, 5).value();
  const size_t rows = 5 * 2 * 16;
  std::set<std::byte*> seen;
  for (int64_t l = 0; l < 3; ++l) {
    const KvLayerMemory m = pool.layer(l);
    for (std::byte* p : {m.key, m.value}) {
      ASSERT_NE(p, nullptr);
      std::memset(p, static_cast<int>(l + 1), rows * 64);
      EXPECT_TRUE(seen.insert(p).second);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    }
    for (std::byte* p : {m.key_side, m.value_side}) {
      ASSERT_NE(p, nullptr);
      std::memset(p, static_cast<int>(l + 7), rows * 2);
      EXPECT_TRUE(seen.insert(p).second);
    }
  }
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(pool.layer(l).key[rows * 64 - 1], std::byte(l + 1));
    EXPECT_EQ(pool.layer(l).value_side[rows * 2 - 1], std::byte(l + 7));
  }
}

TEST(KvPagePool, empty_pool_admits_only_empty_sequences) {
  auto pool = KvPagePool::create(geometry(), 0).value();
  EXPECT_EQ(pool.total_bytes(), 0);
  EXPECT_TRUE(pool.admit(1, 0).ok());
  EXPECT_EQ(pool.append(1, 1).code(), StatusCode::kResourceExhausted);
}

// Layers whose MLA / indexer caches hold fewer rows than tokens per page (DeepSeek-V4's compressed entries:
// page_size / ratio rows; none on a sliding-window-only layer) own exactly those bytes.
TEST(KvPagePool, per_layer_rows_per_page) {
  KvPageGeometry g;
  g.num_layers = 3;
  g.page_size = 128;
  g.mla_row_bytes = 1024;
  g.indexer_row_bytes = 256;
  g.mla_rows_per_page = {0, 32, 1};
  g.indexer_rows_per_page = {0, 32, 0};
  EXPECT_EQ(g.bytes_per_page(), 32 * 1024 + 32 * 256 + 1024);
  EXPECT_EQ(g.bytes_per_token(), (32 * 1024 + 32 * 256 + 1024) / 128);
  auto pool = KvPagePool::create(g, 5);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_EQ(pool->total_bytes(), 5 * g.bytes_per_page());
  EXPECT_EQ(pool->layer(0).mla, nullptr);
  EXPECT_EQ(pool->layer(0).indexer, nullptr);
  EXPECT_NE(pool->layer(1).indexer, nullptr);
  EXPECT_EQ(pool->layer(2).indexer, nullptr);
  // Every byte of the last page of each cache is writable (AddressSanitizer checks the extent).
  std::memset(pool->layer(1).mla, 1, 5 * 32 * 1024);
  std::memset(pool->layer(1).indexer, 1, 5 * 32 * 256);
  std::memset(pool->layer(2).mla, 1, 5 * 1 * 1024);
  g.mla_rows_per_page = {0, 129, 1};
  EXPECT_EQ(KvPagePool::create(g, 1).status().message(),
            "kv page pool: per-layer rows per page (mla [0, 129, 1], indexer [0, 32, 0]) are invalid for 3 layers of "
            "page_size 128; each list must have one entry per layer in [0, page_size] and a page must hold at least "
            "one byte");
  g.mla_rows_per_page = {0, 32};
  EXPECT_EQ(KvPagePool::create(g, 1).status().code(), StatusCode::kInvalidArgument);
}

// State layers of different region sizes: every region of a slot is zeroed at admission; a negative region
// or a state layer without bytes is refused.
TEST(KvPagePool, state_regions_per_layer) {
  KvPageGeometry g = geometry();
  g.state.layers = {{100, 0, 0, 40, 0}, {100, 0, 0, 0, 8}};
  EXPECT_EQ(g.state.bytes_per_slot(), 248);
  auto pool = KvPagePool::create(g, 4, 3);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_EQ(pool->state_bytes(), 3 * 248);
  EXPECT_EQ(pool->state_layer(0).region[1], nullptr);
  EXPECT_EQ(pool->state_layer(1).region[3], nullptr);
  for (int64_t l = 0; l < 2; ++l) {
    for (int r = 0; r < kStateRegions; ++r) {
      if (std::byte* p = pool->state_layer(l).region[r])
        std::memset(p, 0x5a, static_cast<size_t>(3 * g.state.layers[l][r]));
    }
  }
  ASSERT_TRUE(pool->admit(7, 10).ok());
  const int32_t slot = pool->state_slot(7);
  for (int64_t l = 0; l < 2; ++l) {
    for (int r = 0; r < kStateRegions; ++r) {
      const std::byte* p = pool->state_layer(l).region[r];
      for (int64_t i = 0; p && i < g.state.layers[l][r]; ++i) {
        ASSERT_EQ(p[slot * g.state.layers[l][r] + i], std::byte{0}) << "layer " << l << " region " << r;
      }
    }
  }
  g.state.layers = {{100, -1, 0, 0, 0}};
  EXPECT_EQ(KvPagePool::create(g, 1, 1).status().message(),
            "kv page pool: state layer 0 has region bytes [100, -1, 0, 0, 0]; each must be >= 0 and a layer with state "
            "must have bytes");
  g.state.layers = {{100, 0, 0, 0, 0}, {0, 0, 0, 0, 0}};
  EXPECT_EQ(KvPagePool::create(g, 1, 1).status().code(), StatusCode::kInvalidArgument);
}


namespace prefix {
std::vector<int32_t> tokens(int64_t n, int32_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + salt) % 1000);
  return t;
}
void publish(KvPagePool& pool, SeqId id, const std::vector<int32_t>& t) {
  pool.cache_full_pages(id, [&](int64_t i) { return t[static_cast<size_t>(i)]; });
}
std::vector<int32_t> pages(const KvPagePool& pool, SeqId id) {
  return {pool.block_table(id).begin(), pool.block_table(id).end()};
}
}  // namespace prefix

// Prefix cache: full pages published by one sequence are found by the next one with the same leading tokens (whole
// pages only, up to the asked limit), shared (reference-counted), kept after release as free-but-cached pages, and
// evicted least recently released first, the last pages of a sequence before the pages they follow.
TEST(KvPagePool, prefix_cache_shares_full_pages_and_evicts_least_recently_released) {
  auto pool = KvPagePool::create(geometry(), 6).value();
  EXPECT_TRUE(pool.lookup_prefix(prefix::tokens(300, 1), 9).empty());  // off: nothing
  pool.enable_prefix_cache(7);
  const std::vector<int32_t> a = prefix::tokens(300, 1);  // pages 0, 1 full; 44 tokens in page 2
  ASSERT_TRUE(pool.admit(1, 300).ok());
  EXPECT_TRUE(pool.lookup_prefix(a, 9).empty());  // nothing published yet
  prefix::publish(pool, 1, a);
  EXPECT_EQ(pool.cached_pages(), 2);
  EXPECT_EQ(pool.lookup_prefix(a, 9), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(pool.lookup_prefix(a, 1), (std::vector<int32_t>{0}));
  std::vector<int32_t> b = a;
  b[200] = 999;  // differs in the second page
  EXPECT_EQ(pool.lookup_prefix(b, 9), (std::vector<int32_t>{0}));
  EXPECT_TRUE(pool.lookup_prefix(std::vector<int32_t>(a.begin(), a.begin() + 127), 9).empty());  // no whole page

  // A second sequence on the cached pages: shared, so only its own page is taken.
  const std::vector<int32_t> hit = pool.lookup_prefix(a, 2);
  EXPECT_TRUE(pool.can_admit(260, 0, hit));
  ASSERT_TRUE(pool.admit(2, 260, 0, hit).ok());
  EXPECT_EQ(prefix::pages(pool, 2), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(pool.free_pages(), 2);
  ASSERT_TRUE(pool.release(1).ok());  // pages 0 and 1 still held by 2; page 2 free
  EXPECT_EQ(pool.free_pages(), 3);
  ASSERT_TRUE(pool.release(2).ok());  // 0 and 1 cached and free; 3 free
  EXPECT_EQ(pool.free_pages(), 6);
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.cached_pages(), 2);
  EXPECT_EQ(pool.lookup_prefix(a, 9), (std::vector<int32_t>{0, 1}));

  // Uncached pages go first; then the cached ones, page 1 (the last of its sequence) before page 0.
  ASSERT_TRUE(pool.admit(3, 4 * 128).ok());
  EXPECT_EQ(pool.evictions(), 0);
  EXPECT_EQ(pool.lookup_prefix(a, 9), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(pool.admit(4, 1).ok());
  EXPECT_EQ(pool.evictions(), 1);
  EXPECT_EQ(prefix::pages(pool, 4), (std::vector<int32_t>{1}));
  EXPECT_EQ(pool.lookup_prefix(a, 9), (std::vector<int32_t>{0}));
  EXPECT_EQ(pool.cached_pages(), 1);
  EXPECT_EQ(pool.free_pages(), 1);

  // A sequence that starts on a cached page nobody holds takes it out of the free pages; all or nothing.
  ASSERT_TRUE(pool.release(4).ok());  // page 1 (not cached any more) free again
  const std::vector<int32_t> hit0 = pool.lookup_prefix(a, 9);
  EXPECT_FALSE(pool.can_admit(3 * 128, 0, hit0));  // 3 pages: page 0 + 2 of the 1 left
  const Status full = pool.admit(5, 3 * 128, 0, hit0);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.to_string();
  EXPECT_EQ(pool.free_pages(), 2);
  EXPECT_EQ(pool.cached_pages(), 1);
  ASSERT_TRUE(pool.admit(5, 2 * 128, 0, hit0).ok());
  EXPECT_EQ(prefix::pages(pool, 5), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(pool.free_pages(), 0);
}

// A page follows the page it was cached after: once that one is evicted (and reused for other tokens), the page is
// no longer found, and a sequence publishing the same contents again takes its name.
TEST(KvPagePool, prefix_cache_forgets_a_page_whose_prefix_was_evicted) {
  auto pool = KvPagePool::create(geometry(), 3).value();
  pool.enable_prefix_cache(0);
  const std::vector<int32_t> a = prefix::tokens(256, 3);
  ASSERT_TRUE(pool.admit(1, 256).ok());  // pages 0, 1
  prefix::publish(pool, 1, a);
  ASSERT_TRUE(pool.release(1).ok());  // LRU: page 1, then page 0
  ASSERT_TRUE(pool.admit(2, 128).ok());  // page 2 (free)
  ASSERT_TRUE(pool.admit(3, 128).ok());  // evicts page 1
  ASSERT_TRUE(pool.release(3).ok());
  EXPECT_EQ(pool.lookup_prefix(a, 9), (std::vector<int32_t>{0}));
  // Page 0 evicted too: a's second page, were it cached again, must not follow some other page 0.
  ASSERT_TRUE(pool.admit(4, 2 * 128).ok());  // pages 1, 0 (page 0 evicted)
  EXPECT_EQ(pool.evictions(), 2);
  EXPECT_TRUE(pool.lookup_prefix(a, 9).empty());
  ASSERT_TRUE(pool.release(4).ok());
  ASSERT_TRUE(pool.release(2).ok());
  ASSERT_TRUE(pool.admit(5, 256).ok());
  prefix::publish(pool, 5, a);
  EXPECT_EQ(pool.lookup_prefix(a, 9), prefix::pages(pool, 5));
  // Admitting with a prefix is refused without the cache, and beyond the sequence's tokens.
  auto off = KvPagePool::create(geometry(), 3).value();
  EXPECT_EQ(off.admit(1, 200, 0, std::vector<int32_t>{0}).message(),
            "kv page pool: sequence 1 starts on 1 cached pages but the prefix cache is off");
  ASSERT_TRUE(pool.release(5).ok());
  EXPECT_EQ(pool.admit(6, 100, 0, pool.lookup_prefix(a, 9)).message(),
            "kv page pool: sequence 6 starts on 2 cached pages but has only 100 tokens");
}

}  // namespace
}  // namespace genbridge::runtime
