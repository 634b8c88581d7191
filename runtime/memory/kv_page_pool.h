#pragma once
// KV page pool: owns the paged KV-cache memory of every layer and the per-sequence block tables.
// Generation-agnostic: it knows page geometry in bytes (from the DeviceOperator's contract), never a
// representation or a generation. The DeviceOperator turns a layer's memory into typed cache views.
//
// Layout of one layer (pages are the cache's blocks; a token's slot is page * page_size + offset):
//   key, value:           [num_pages, num_kv_heads, page_size, row_bytes]       bytes
//   key_side, value_side: [num_pages, num_kv_heads, page_size, side_row_bytes]  bytes (absent if 0)
//   mla, mla_scale, mla_rope, indexer: [num_pages, page_size, <their row bytes>] bytes (absent if 0): MLA
//                         models keep one latent row (and separate scale / rope rows) per token instead of
//                         K/V (num_kv_heads = 0), DSA models one indexer key row per token.
// DeepSeek-V4 keeps one compressed entry per `ratio` tokens instead of one row per token: the geometry then gives,
// per layer, how many MLA / indexer rows a page holds (page_size / ratio; 0: none in that layer), and layer l's
// caches are [num_pages, rows_per_page[l], <row bytes>].
// Beside the pages, a model with per-sequence state (Qwen3.5's Gated DeltaNet; DeepSeek-V4's sliding-window ring
// and compressors' unfinished windows) keeps a state pool: one slot per running sequence, taken at admit()
// (zeroed: a fresh sequence's state) and returned with its pages at release(). Each state layer has up to
// kStateRegions regions, each its own buffer [num_state_slots, region bytes]; the DeviceOperator types them.
// Prefix cache (enable_prefix_cache): a full page's contents are named by its tokens chained with its prefix's; a
// sequence's full pages are published under that name (cache_full_pages), a new sequence starts on the pages of the
// longest published prefix of its tokens (lookup_prefix, then admit with them), shared and reference-counted, and a
// page nobody holds stays cached, counted as free, until a page is needed and it is the least recently released
// (evicted). A hit is exact: the tokens of every page and the page it follows are compared, not only the hash. The
// pool never looks at the bytes: that equal tokens give equal bytes is the caller's contract (pages of a model with
// per-sequence state are not, and the engine does not cache them).
// Not thread-safe: one scheduler thread admits, grows and frees sequences.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::runtime {

// Regions per state layer (what each holds is the DeviceOperator's contract; an unused region has 0 bytes).
inline constexpr int kStateRegions = 5;
using StateRegionBytes = std::array<int64_t, kStateRegions>;

// Bytes of one sequence's state, per state layer and region, as the DeviceOperator's state contract gives them.
struct StateSlotGeometry {
  std::vector<StateRegionBytes> layers;  // one entry per layer with state (empty: the model has none)
  // What a slot holds, named by the DeviceOperator for messages ("linear-attention state"); not part of the bytes.
  std::string contents;

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  // One slot's bytes in layer `l` (all regions).
  int64_t layer_bytes(int64_t l) const;
  int64_t bytes_per_slot() const;
  bool empty() const { return bytes_per_slot() == 0; }
  // Equal when the bytes are (contents is a name).
  friend bool operator==(const StateSlotGeometry& a, const StateSlotGeometry& b) { return a.layers == b.layers; }
};

// Bytes of the paged KV cache per (token, kv head), as the DeviceOperator's contract gives them.
struct KvPageGeometry {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t page_size = 0;       // tokens per page
  int64_t row_bytes = 0;       // one (token, kv head) row of a layer's K cache (V identical), packed metadata included
  int64_t side_row_bytes = 0;  // one (token, kv head) entry of each separate side (scale) cache; 0 = none
  // Per token rows of MLA / DSA models (0 = none), as the DeviceOperator's contract gives them.
  int64_t mla_row_bytes = 0;      // the MLA latent row (in-row scales and rope included)
  int64_t mla_scale_bytes = 0;    // the separate MLA scale cache entry
  int64_t mla_rope_bytes = 0;     // the separate MLA rope cache row
  int64_t indexer_row_bytes = 0;  // the indexer key row (packed scale included)
  // DeepSeek-V4 (num_layers entries each, or both empty: page_size rows in every layer): the MLA (compressed
  // entry) rows and the indexer key rows a page holds in each layer.
  std::vector<int64_t> mla_rows_per_page;
  std::vector<int64_t> indexer_rows_per_page;
  // Per-sequence state (not per token: KvPagePool's state slots hold it). num_layers above counts the layers
  // with a paged cache.
  StateSlotGeometry state;

  // Bytes one token occupies in one layer: K and V rows plus their side entries, and the per-token MLA and
  // indexer rows (the layers' average for a geometry with rows per page).
  int64_t bytes_per_token_per_layer() const {
    if (!mla_rows_per_page.empty()) return bytes_per_page() / page_size / num_layers;
    return 2 * num_kv_heads * (row_bytes + side_row_bytes) + mla_row_bytes + mla_scale_bytes + mla_rope_bytes +
           indexer_row_bytes;
  }
  // Bytes of one page over all layers, and per token (rounded down with rows per page).
  int64_t bytes_per_page() const;
  int64_t bytes_per_token() const { return bytes_per_page() / page_size; }
  // Rows a page holds of layer `l`'s MLA / indexer caches (page_size unless the geometry says otherwise).
  int64_t mla_rows(int64_t l) const { return mla_rows_per_page.empty() ? page_size : mla_rows_per_page[l]; }
  int64_t indexer_rows(int64_t l) const { return indexer_rows_per_page.empty() ? page_size : indexer_rows_per_page[l]; }
  // Pages that hold `tokens` tokens.
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size - 1) / page_size; }
};

using SeqId = int64_t;

// Raw memory of one layer's state: region r is [num_state_slots, layers[l][r]] bytes (null when 0). Pointers stay
// valid for the pool's lifetime.
struct StateLayerMemory {
  std::array<std::byte*, kStateRegions> region{};
};

// Raw memory of one layer (see the layout above). Pointers stay valid for the pool's lifetime.
struct KvLayerMemory {
  std::byte* key = nullptr;
  std::byte* value = nullptr;
  std::byte* key_side = nullptr;    // null when side_row_bytes == 0
  std::byte* value_side = nullptr;  // null when side_row_bytes == 0
  std::byte* mla = nullptr;         // null when mla_row_bytes == 0 (and so on)
  std::byte* mla_scale = nullptr;
  std::byte* mla_rope = nullptr;
  std::byte* indexer = nullptr;
};

class KvPagePool {
 public:
  // A pool of exactly `num_pages` pages (0 <= num_pages < 2^31) and, when geometry.state is not empty,
  // `num_state_slots` state slots (0 <= slots < 2^31; ignored without state). Allocates all memory now; the
  // contents of slots nobody wrote are unspecified. InvalidArgument for a bad geometry, ResourceExhausted if
  // the memory cannot be allocated.
  static Result<KvPagePool> create(const KvPageGeometry& geometry, int64_t num_pages, int64_t num_state_slots = 0);
  // As many pages as fit in `max_bytes` (at least one, else ResourceExhausted naming the page size).
  static Result<KvPagePool> create_for_budget(const KvPageGeometry& geometry, int64_t max_bytes);

  KvPagePool(KvPagePool&&) noexcept;
  KvPagePool& operator=(KvPagePool&&) noexcept;
  ~KvPagePool();

  const KvPageGeometry& geometry() const { return geometry_; }
  int64_t num_pages() const { return num_pages_; }
  // Pages not held by a sequence (cached ones included: they are evicted when needed).
  int64_t free_pages() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used_pages() const { return num_pages_ - free_pages(); }
  // Cache bytes owned by the pool: num_pages * page_size * bytes_per_token, exactly.
  int64_t total_bytes() const { return num_pages_ * geometry_.bytes_per_page(); }
  // Cache bytes of the pages currently held by sequences.
  int64_t bytes_in_use() const { return used_pages() * geometry_.bytes_per_page(); }
  // Pages needed to hold `tokens` tokens.
  int64_t pages_for(int64_t tokens) const { return geometry_.pages_for(tokens); }

  // State slots (0 without state), free ones, and the bytes they own.
  int64_t num_state_slots() const { return num_state_slots_; }
  int64_t free_state_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  int64_t state_bytes() const { return num_state_slots_ * geometry_.state.bytes_per_slot(); }
  bool has_state() const { return !geometry_.state.empty(); }

  // Whether a new sequence of max(num_tokens, reserve_tokens) tokens fits now (pages, and a state slot
  // when the model has state), starting on `prefix` (lookup_prefix's pages).
  bool can_admit(int64_t num_tokens, int64_t reserve_tokens = 0, std::span<const int32_t> prefix = {}) const;
  // Why a sequence of max(num_tokens, reserve_tokens) tokens can never be admitted, even into an empty
  // pool: which pool is too small and by how much ("needs 9 KV pages ... but the pool has 8", "needs a state
  // slot but the state pool has none"); empty when it can.
  std::string never_fits(int64_t num_tokens, int64_t reserve_tokens = 0) const;
  // Starts sequence `id` with `num_tokens` tokens and pages for max(num_tokens, reserve_tokens) (a
  // reservation lets later appends never fail), and a zeroed state slot when the model has state. `prefix`: cached
  // pages (lookup_prefix's, just now) the sequence starts on, shared; num_tokens must cover them. All or
  // nothing: ResourceExhausted (free and needed pages or slots named) leaves the pool unchanged;
  // InvalidArgument if `id` is already admitted, a count is negative or the prefix is longer than num_tokens.
  Status admit(SeqId id, int64_t num_tokens, int64_t reserve_tokens = 0, std::span<const int32_t> prefix = {});
  // Grows sequence `id` by `num_tokens`, taking pages beyond its reservation as needed. All or nothing.
  Status append(SeqId id, int64_t num_tokens);
  // Returns every page (and the state slot) of `id` to the pool. InvalidArgument if `id` is not admitted.
  Status release(SeqId id);

  // The prefix cache (see above): off until enabled; `salt` goes into every page's name (what else the bytes depend
  // on: the model, the KV representation).
  void enable_prefix_cache(uint64_t salt);
  bool prefix_cache_enabled() const { return caching_; }
  // The cached pages holding the longest prefix of `tokens` in whole pages, at most max_pages of them.
  std::vector<int32_t> lookup_prefix(std::span<const int32_t> tokens, int64_t max_pages) const;
  // Publishes sequence `id`'s full pages not yet published; token_at(i) is its token at position i (< length).
  void cache_full_pages(SeqId id, const std::function<int32_t(int64_t)>& token_at);
  // Cached pages (held or not), and the cached pages evicted so far.
  int64_t cached_pages() const { return static_cast<int64_t>(cache_.size()); }
  int64_t evictions() const { return evictions_; }

  bool contains(SeqId id) const { return seqs_.count(id) != 0; }
  // Tokens in sequence `id` (0 if not admitted).
  int64_t length(SeqId id) const;
  // Tokens sequence `id` can hold without taking another page.
  int64_t capacity(SeqId id) const;
  // Tokens sequence `id` can still grow by: its pages' room plus every free page (0 if not admitted).
  int64_t growth_room(SeqId id) const {
    return contains(id) ? capacity(id) - length(id) + free_pages() * geometry_.page_size : 0;
  }
  // Pages of `id` in token order (empty if not admitted). Valid until the sequence changes.
  std::span<const int32_t> block_table(SeqId id) const;
  // Flat slots (page * page_size + offset) of positions [begin, end) of `id` into out[0, end - begin).
  Status slots(SeqId id, int64_t begin, int64_t end, std::span<int64_t> out) const;
  // Writes the block tables of `ids` as rows of an int32 [ids.size(), max_blocks] table (row-major, rows
  // `max_blocks` apart), padding each row with -1. InvalidArgument if a row does not fit or an id is unknown.
  Status fill_block_tables(std::span<const SeqId> ids, int64_t max_blocks, std::span<int32_t> table) const;

  // Memory of layer `layer` (0 <= layer < num_layers).
  KvLayerMemory layer(int64_t layer) const;
  // The state slot of sequence `id` (-1 if not admitted or the model has no state).
  int32_t state_slot(SeqId id) const;
  // State memory of state layer `layer` (0 <= layer < geometry().state.num_layers()).
  StateLayerMemory state_layer(int64_t layer) const;

 private:
  struct Seq {
    int64_t length = 0;
    std::vector<int32_t> pages;
    int32_t state_slot = -1;
    std::vector<uint64_t> keys;  // prefix cache: the names of its first keys.size() full pages
  };
  // Prefix cache, per page.
  struct PageInfo {
    int32_t refs = 0;        // sequences holding it
    bool cached = false;     // in cache_ under `key`
    uint64_t key = 0;
    int32_t parent = -1;     // the cached page of the previous page's contents (-1: the first page)
    uint32_t parent_gen = 0; // parent's gen when this page was cached (a mismatch: the parent was evicted)
    uint32_t gen = 0;        // bumped when the page leaves the cache
    std::list<int32_t>::iterator lru;  // its place in lru_ while cached and held by nobody
  };
  struct AlignedDelete {
    void operator()(std::byte* p) const;
  };
  KvPagePool() = default;
  Status take_pages(int64_t n, std::vector<int32_t>& into, const std::string& what);
  // The page's name under `parent_key` (0: the first page) and its tokens.
  uint64_t page_key(uint64_t parent_key, std::span<const int32_t> tokens) const;
  // Whether cached page p still follows `parent` (-1: none) as when it was cached.
  bool follows(int32_t p, int32_t parent) const;
  // Pages of `prefix` that a sequence holds (the others are cached pages counted as free).
  int64_t held_pages(std::span<const int32_t> prefix) const;
  // Takes p out of the cache (its children stop matching); to free_ when nobody holds it.
  void uncache(int32_t p);

  KvPageGeometry geometry_;
  int64_t num_pages_ = 0;
  std::vector<int32_t> free_;  // a stack: pages are handed out lowest index first
  std::unordered_map<SeqId, Seq> seqs_;
  // Per layer: key, value, key_side, value_side, mla, mla_scale, mla_rope, indexer.
  std::vector<std::unique_ptr<std::byte, AlignedDelete>> buffers_;
  bool caching_ = false;
  uint64_t salt_ = 0;
  std::vector<PageInfo> info_;                  // prefix cache: per page
  std::vector<int32_t> page_tokens_;            // prefix cache: page_size tokens per cached page
  std::unordered_map<uint64_t, int32_t> cache_; // name -> page
  std::list<int32_t> lru_;                      // cached pages nobody holds, least recently released first
  int64_t evictions_ = 0;
  int64_t num_state_slots_ = 0;
  std::vector<int32_t> free_slots_;  // a stack, lowest slot first
  // Per state layer: its kStateRegions regions.
  std::vector<std::unique_ptr<std::byte, AlignedDelete>> state_buffers_;
};

}  // namespace genbridge::runtime
