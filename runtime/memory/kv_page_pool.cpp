#include "runtime/memory/kv_page_pool.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

namespace genbridge::runtime {
namespace {

constexpr std::align_val_t kAlign{64};

std::string mib(int64_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20)); }

Status check_geometry(const KvPageGeometry& g) {
  const bool gqa = g.num_kv_heads >= 1 && g.row_bytes >= 1;
  const bool mla = g.num_kv_heads == 0 && g.row_bytes == 0 && g.side_row_bytes == 0 && g.mla_row_bytes >= 1;
  for (int64_t l = 0; l < g.state.num_layers(); ++l) {
    const StateRegionBytes& r = g.state.layers[l];
    if (std::any_of(r.begin(), r.end(), [](int64_t b) { return b < 0; }) || g.state.layer_bytes(l) < 1) {
      return invalid_argument(fmt::format(
          "kv page pool: state layer {} has region bytes [{}]; each must be >= 0 and a layer with state must have "
          "bytes",
          l, fmt::join(r, ", ")));
    }
  }
  const bool per_layer_rows = !g.mla_rows_per_page.empty() || !g.indexer_rows_per_page.empty();
  if (per_layer_rows) {
    const auto bad_rows = [&](const std::vector<int64_t>& rows) {
      return static_cast<int64_t>(rows.size()) != g.num_layers ||
             std::any_of(rows.begin(), rows.end(), [&](int64_t r) { return r < 0 || r > g.page_size; });
    };
    if (bad_rows(g.mla_rows_per_page) || bad_rows(g.indexer_rows_per_page) || g.num_layers < 1 || g.page_size < 1 ||
        g.bytes_per_page() < 1) {
      return invalid_argument(fmt::format(
          "kv page pool: per-layer rows per page (mla [{}], indexer [{}]) are invalid for {} layers of page_size {}; "
          "each list must have one entry per layer in [0, page_size] and a page must hold at least one byte",
          fmt::join(g.mla_rows_per_page, ", "), fmt::join(g.indexer_rows_per_page, ", "), g.num_layers, g.page_size));
    }
  }
  if (g.num_layers < 1 || g.page_size < 1 || g.side_row_bytes < 0 || (!gqa && !mla) || g.mla_row_bytes < 0 ||
      g.mla_scale_bytes < 0 || g.mla_rope_bytes < 0 || g.indexer_row_bytes < 0) {
    std::string mla_text;
    if (g.mla_row_bytes != 0 || g.mla_scale_bytes != 0 || g.mla_rope_bytes != 0 || g.indexer_row_bytes != 0) {
      mla_text = fmt::format(", mla_row_bytes {}, mla_scale_bytes {}, mla_rope_bytes {}, indexer_row_bytes {}",
                             g.mla_row_bytes, g.mla_scale_bytes, g.mla_rope_bytes, g.indexer_row_bytes);
    }
    return invalid_argument(fmt::format(
        "kv page pool: geometry (num_layers {}, num_kv_heads {}, page_size {}, row_bytes {}, side_row_bytes {}{}) is "
        "invalid; every field must be >= 1 except side_row_bytes >= 0",
        g.num_layers, g.num_kv_heads, g.page_size, g.row_bytes, g.side_row_bytes, mla_text));
  }
  return ok_status();
}

constexpr size_t kBuffersPerLayer = 8;

}  // namespace

void KvPagePool::AlignedDelete::operator()(std::byte* p) const { ::operator delete[](p, kAlign); }

Result<KvPagePool> KvPagePool::create(const KvPageGeometry& g, int64_t num_pages, int64_t num_state_slots) {
  GB_RETURN_IF_ERROR(check_geometry(g));
  if (g.state.empty()) num_state_slots = 0;
  if (num_state_slots < 0 || num_state_slots > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(
        fmt::format("kv page pool: num_state_slots is {} but must be in [0, 2^31)", num_state_slots));
  }
  if (num_state_slots > 0 && g.state.bytes_per_slot() > std::numeric_limits<int64_t>::max() / 4 / num_state_slots) {
    return resource_exhausted(fmt::format("kv page pool: {} state slots of {} bytes overflow the address space",
                                          num_state_slots, g.state.bytes_per_slot()));
  }
  if (num_pages < 0 || num_pages > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(fmt::format("kv page pool: num_pages is {} but must be in [0, 2^31)", num_pages));
  }
  // Every buffer size must fit in int64 (and the page count in the slot arithmetic).
  if (num_pages > 0 && g.bytes_per_page() > std::numeric_limits<int64_t>::max() / 4 / num_pages) {
    return resource_exhausted(
        fmt::format("kv page pool: {} pages of {} bytes overflow the address space", num_pages, g.bytes_per_page()));
  }
  KvPagePool pool;
  pool.geometry_ = g;
  pool.num_pages_ = num_pages;
  pool.free_.resize(static_cast<size_t>(num_pages));
  for (int64_t i = 0; i < num_pages; ++i) pool.free_[i] = static_cast<int32_t>(num_pages - 1 - i);
  const int64_t row_buffer = num_pages * g.num_kv_heads * g.page_size * g.row_bytes;
  const int64_t side_buffer = num_pages * g.num_kv_heads * g.page_size * g.side_row_bytes;
  for (int64_t l = 0; l < g.num_layers; ++l) {
    const int64_t mla_rows = num_pages * g.mla_rows(l), indexer_rows = num_pages * g.indexer_rows(l);
    for (int64_t bytes :
         {row_buffer, row_buffer, side_buffer, side_buffer, mla_rows * g.mla_row_bytes, mla_rows * g.mla_scale_bytes,
          mla_rows * g.mla_rope_bytes, indexer_rows * g.indexer_row_bytes}) {
      std::byte* p = nullptr;
      if (bytes > 0) {
        p = static_cast<std::byte*>(::operator new[](static_cast<size_t>(bytes), kAlign, std::nothrow));
        if (p == nullptr) {
          return resource_exhausted(fmt::format("kv page pool: cannot allocate {} for {} pages ({} in all)", mib(bytes),
                                                num_pages, mib(pool.total_bytes())));
        }
      }
      pool.buffers_.emplace_back(p);
    }
  }
  pool.num_state_slots_ = num_state_slots;
  pool.free_slots_.resize(static_cast<size_t>(num_state_slots));
  for (int64_t i = 0; i < num_state_slots; ++i) pool.free_slots_[i] = static_cast<int32_t>(num_state_slots - 1 - i);
  for (int64_t l = 0; l < g.state.num_layers() && num_state_slots > 0; ++l) {
    for (int64_t region_bytes : g.state.layers[l]) {
      const int64_t bytes = num_state_slots * region_bytes;
      std::byte* p = nullptr;
      if (bytes > 0) {
        p = static_cast<std::byte*>(::operator new[](static_cast<size_t>(bytes), kAlign, std::nothrow));
        if (p == nullptr) {
          return resource_exhausted(fmt::format("kv page pool: cannot allocate {} for {} state slots ({} in all)",
                                                mib(bytes), num_state_slots, mib(pool.state_bytes())));
        }
      }
      pool.state_buffers_.emplace_back(p);
    }
  }
  return pool;
}

Result<KvPagePool> KvPagePool::create_for_budget(const KvPageGeometry& g, int64_t max_bytes) {
  GB_RETURN_IF_ERROR(check_geometry(g));
  const int64_t pages = std::min<int64_t>(max_bytes / g.bytes_per_page(), std::numeric_limits<int32_t>::max());
  if (pages < 1) {
    return resource_exhausted(
        fmt::format("kv page pool: a budget of {} bytes holds no page of {} bytes ({} tokens x {} "
                    "bytes per token)",
                    max_bytes, g.bytes_per_page(), g.page_size, g.bytes_per_token()));
  }
  return create(g, pages);
}

KvPagePool::KvPagePool(KvPagePool&&) noexcept = default;
KvPagePool& KvPagePool::operator=(KvPagePool&&) noexcept = default;
KvPagePool::~KvPagePool() = default;

int64_t KvPagePool::held_pages(std::span<const int32_t> prefix) const {
  int64_t held = 0;
  for (int32_t p : prefix) held += info_[static_cast<size_t>(p)].refs > 0 ? 1 : 0;
  return held;
}

bool KvPagePool::can_admit(int64_t num_tokens, int64_t reserve_tokens, std::span<const int32_t> prefix) const {
  // Prefix pages another sequence holds need no free page; the others are free (cached) pages it takes.
  return num_tokens >= 0 && reserve_tokens >= 0 &&
         pages_for(std::max(num_tokens, reserve_tokens)) - held_pages(prefix) <= free_pages() &&
         (!has_state() || free_state_slots() > 0);
}

std::string KvPagePool::never_fits(int64_t num_tokens, int64_t reserve_tokens) const {
  const int64_t tokens = std::max(num_tokens, reserve_tokens), pages = pages_for(tokens);
  if (pages > num_pages_) {
    return fmt::format("needs {} KV pages ({} tokens at {} tokens per page) but the pool has only {} pages ({} short)",
                       pages, tokens, geometry_.page_size, num_pages_, pages - num_pages_);
  }
  if (has_state() && num_state_slots_ == 0) {
    return fmt::format("needs a state slot ({} per sequence) but the state pool has none (1 short)",
                       mib(geometry_.state.bytes_per_slot()));
  }
  return "";
}

Status KvPagePool::take_pages(int64_t n, std::vector<int32_t>& into, const std::string& what) {
  if (n > free_pages()) {
    return resource_exhausted(fmt::format(
        "kv page pool: {} needs {} more page{} of {} tokens but only {} of {} pages "
        "are free ({} per page)",
        what, n, n == 1 ? "" : "s", geometry_.page_size, free_pages(), num_pages_, mib(geometry_.bytes_per_page())));
  }
  for (int64_t i = 0; i < n; ++i) {
    int32_t p = 0;
    if (!free_.empty()) {
      p = free_.back();
      free_.pop_back();
    } else {  // the least recently released cached page
      p = lru_.front();
      lru_.pop_front();
      PageInfo& pi = info_[static_cast<size_t>(p)];
      cache_.erase(pi.key);
      pi.cached = false;
      ++pi.gen;
      ++evictions_;
    }
    if (caching_) info_[static_cast<size_t>(p)].refs = 1;
    into.push_back(p);
  }
  return ok_status();
}

void KvPagePool::enable_prefix_cache(uint64_t salt) {
  GB_CHECK(seqs_.empty(), "KvPagePool::enable_prefix_cache: enable it before the first sequence");
  caching_ = true;
  salt_ = salt;
  info_.assign(static_cast<size_t>(num_pages_), PageInfo{});
  page_tokens_.assign(static_cast<size_t>(num_pages_ * geometry_.page_size), 0);
}

uint64_t KvPagePool::page_key(uint64_t parent_key, std::span<const int32_t> tokens) const {
  // A 64-bit mix (splitmix64's finalizer per token); a hit is confirmed on the tokens, so collisions cost a miss.
  uint64_t h = parent_key ^ (salt_ * 0x9E3779B97F4A7C15ull) ^ 0xD6E8FEB86659FD93ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  return h == 0 ? 1 : h;  // 0 names "no parent"
}

bool KvPagePool::follows(int32_t p, int32_t parent) const {
  const PageInfo& pi = info_[static_cast<size_t>(p)];
  if (pi.parent != parent) return false;
  if (parent < 0) return true;
  const PageInfo& pp = info_[static_cast<size_t>(parent)];
  return pp.cached && pp.gen == pi.parent_gen;
}

void KvPagePool::uncache(int32_t p) {
  PageInfo& pi = info_[static_cast<size_t>(p)];
  if (!pi.cached) return;
  cache_.erase(pi.key);
  pi.cached = false;
  ++pi.gen;
  if (pi.refs == 0) {
    lru_.erase(pi.lru);
    free_.push_back(p);
  }
}

std::vector<int32_t> KvPagePool::lookup_prefix(std::span<const int32_t> tokens, int64_t max_pages) const {
  std::vector<int32_t> out;
  if (!caching_) return out;
  const int64_t ps = geometry_.page_size;
  uint64_t key = 0;
  int32_t parent = -1;
  for (int64_t j = 0; j < max_pages && (j + 1) * ps <= static_cast<int64_t>(tokens.size()); ++j) {
    const std::span<const int32_t> t = tokens.subspan(static_cast<size_t>(j * ps), static_cast<size_t>(ps));
    key = page_key(key, t);
    const auto it = cache_.find(key);
    if (it == cache_.end()) break;
    const int32_t p = it->second;
    if (!follows(p, parent) || !std::equal(t.begin(), t.end(), page_tokens_.begin() + p * ps)) break;
    out.push_back(p);
    parent = p;
  }
  return out;
}

void KvPagePool::cache_full_pages(SeqId id, const std::function<int32_t(int64_t)>& token_at) {
  if (!caching_) return;
  const auto sit = seqs_.find(id);
  if (sit == seqs_.end()) return;
  Seq& s = sit->second;
  const int64_t ps = geometry_.page_size;
  if ((static_cast<int64_t>(s.keys.size()) + 1) * ps > s.length) return;  // no page filled since (most calls)
  std::vector<int32_t> t(static_cast<size_t>(ps));
  while ((static_cast<int64_t>(s.keys.size()) + 1) * ps <= s.length) {
    const size_t j = s.keys.size();
    for (int64_t i = 0; i < ps; ++i) t[static_cast<size_t>(i)] = token_at(static_cast<int64_t>(j) * ps + i);
    const uint64_t key = page_key(j == 0 ? 0 : s.keys[j - 1], t);
    s.keys.push_back(key);
    const int32_t p = s.pages[j];
    PageInfo& pi = info_[static_cast<size_t>(p)];
    if (pi.cached) continue;  // a page it started on
    // Only after its own previous page, cached: then a lookup that reaches p came through the true prefix.
    const int32_t parent = j == 0 ? -1 : s.pages[j - 1];
    if (parent >= 0 && !info_[static_cast<size_t>(parent)].cached) continue;
    if (const auto it = cache_.find(key); it != cache_.end()) {
      const int32_t q = it->second;
      if (follows(q, info_[static_cast<size_t>(q)].parent)) continue;  // the same contents cached elsewhere
      uncache(q);  // unreachable (its parent left the cache): p takes its name
    }
    cache_.emplace(key, p);
    pi.cached = true;
    pi.key = key;
    pi.parent = parent;
    pi.parent_gen = parent >= 0 ? info_[static_cast<size_t>(parent)].gen : 0;
    std::copy(t.begin(), t.end(), page_tokens_.begin() + p * ps);
  }
}

Status KvPagePool::admit(SeqId id, int64_t num_tokens, int64_t reserve_tokens, std::span<const int32_t> prefix) {
  if (num_tokens < 0 || reserve_tokens < 0) {
    return invalid_argument(
        fmt::format("kv page pool: sequence {} asks for {} tokens ({} reserved); counts must be >= 0", id, num_tokens,
                    reserve_tokens));
  }
  if (contains(id)) return invalid_argument(fmt::format("kv page pool: sequence {} is already admitted", id));
  const int64_t prefix_pages = static_cast<int64_t>(prefix.size());
  if (prefix_pages > 0 && (!caching_ || prefix_pages * geometry_.page_size > num_tokens)) {
    return invalid_argument(fmt::format(
        "kv page pool: sequence {} starts on {} cached pages but {}", id, prefix_pages,
        caching_ ? fmt::format("has only {} tokens", num_tokens) : std::string("the prefix cache is off")));
  }
  Seq seq;
  seq.length = num_tokens;
  const int64_t tokens = std::max(num_tokens, reserve_tokens);
  if (has_state() && free_slots_.empty()) {
    return resource_exhausted(
        fmt::format("kv page pool: sequence {} needs a state slot but all {} slots of the state "
                    "pool are in use ({} per slot)",
                    id, num_state_slots_, mib(geometry_.state.bytes_per_slot())));
  }
  if (!can_admit(num_tokens, reserve_tokens, prefix)) {
    // take_pages names what is missing (the prefix pages nobody holds count as taken).
    std::vector<int32_t> none;
    return take_pages(pages_for(tokens) - held_pages(prefix), none, fmt::format("sequence {} ({} tokens)", id, tokens));
  }
  for (int32_t p : prefix) {  // shared from now on
    PageInfo& pi = info_[static_cast<size_t>(p)];
    if (pi.refs++ == 0) lru_.erase(pi.lru);
    seq.pages.push_back(p);
    seq.keys.push_back(pi.key);
  }
  GB_RETURN_IF_ERROR(
      take_pages(pages_for(tokens) - prefix_pages, seq.pages, fmt::format("sequence {} ({} tokens)", id, tokens)));
  if (has_state()) {
    seq.state_slot = free_slots_.back();
    free_slots_.pop_back();
    // A fresh sequence's state is zero (all-zero bytes: +0 in every state dtype).
    const StateSlotGeometry& sg = geometry_.state;
    for (int64_t l = 0; l < sg.num_layers(); ++l) {
      const StateLayerMemory m = state_layer(l);
      for (int r = 0; r < kStateRegions; ++r) {
        const int64_t bytes = sg.layers[l][r];
        if (m.region[r]) std::memset(m.region[r] + seq.state_slot * bytes, 0, static_cast<size_t>(bytes));
      }
    }
  }
  seqs_.emplace(id, std::move(seq));
  return ok_status();
}

Status KvPagePool::append(SeqId id, int64_t num_tokens) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return invalid_argument(fmt::format("kv page pool: sequence {} is not admitted", id));
  if (num_tokens < 0) {
    return invalid_argument(
        fmt::format("kv page pool: sequence {} cannot grow by {} tokens; counts must be >= 0", id, num_tokens));
  }
  Seq& seq = it->second;
  const int64_t want = seq.length + num_tokens;
  const int64_t more = pages_for(want) - static_cast<int64_t>(seq.pages.size());
  if (more > 0) {
    GB_RETURN_IF_ERROR(
        take_pages(more, seq.pages, fmt::format("sequence {} (growing from {} to {} tokens)", id, seq.length, want)));
  }
  seq.length = want;
  return ok_status();
}

Status KvPagePool::release(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return invalid_argument(fmt::format("kv page pool: sequence {} is not admitted", id));
  // Returned in reverse so that a sequence admitted next reuses the same pages in the same order (and, cached, a
  // sequence's last pages are evicted before the pages they follow).
  for (auto p = it->second.pages.rbegin(); p != it->second.pages.rend(); ++p) {
    if (!caching_) {
      free_.push_back(*p);
      continue;
    }
    PageInfo& pi = info_[static_cast<size_t>(*p)];
    if (--pi.refs > 0) continue;
    if (pi.cached) {
      lru_.push_back(*p);
      pi.lru = std::prev(lru_.end());
    } else {
      free_.push_back(*p);
    }
  }
  if (it->second.state_slot >= 0) free_slots_.push_back(it->second.state_slot);
  seqs_.erase(it);
  return ok_status();
}

int64_t KvPagePool::length(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.length;
}

int64_t KvPagePool::capacity(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.pages.size()) * geometry_.page_size;
}

std::span<const int32_t> KvPagePool::block_table(SeqId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return {};
  return it->second.pages;
}

Status KvPagePool::slots(SeqId id, int64_t begin, int64_t end, std::span<int64_t> out) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return invalid_argument(fmt::format("kv page pool: sequence {} is not admitted", id));
  const Seq& seq = it->second;
  if (begin < 0 || begin > end || end > seq.length) {
    return invalid_argument(fmt::format("kv page pool: positions [{}, {}) are not within sequence {}'s {} tokens",
                                        begin, end, id, seq.length));
  }
  if (static_cast<int64_t>(out.size()) < end - begin) {
    return invalid_argument(
        fmt::format("kv page pool: {} slots do not fit in an output of {}", end - begin, out.size()));
  }
  const int64_t ps = geometry_.page_size;
  for (int64_t p = begin; p < end; ++p) out[p - begin] = seq.pages[p / ps] * ps + p % ps;
  return ok_status();
}

Status KvPagePool::fill_block_tables(std::span<const SeqId> ids, int64_t max_blocks, std::span<int32_t> table) const {
  if (max_blocks < 0 || static_cast<int64_t>(table.size()) < static_cast<int64_t>(ids.size()) * max_blocks) {
    return invalid_argument(fmt::format("kv page pool: a table of {} entries cannot hold {} rows of {} blocks",
                                        table.size(), ids.size(), max_blocks));
  }
  for (size_t r = 0; r < ids.size(); ++r) {
    auto it = seqs_.find(ids[r]);
    if (it == seqs_.end()) return invalid_argument(fmt::format("kv page pool: sequence {} is not admitted", ids[r]));
    if (static_cast<int64_t>(it->second.pages.size()) > max_blocks) {
      return invalid_argument(fmt::format("kv page pool: sequence {} holds {} pages but the table rows have {} entries",
                                          ids[r], it->second.pages.size(), max_blocks));
    }
  }
  for (size_t r = 0; r < ids.size(); ++r) {
    const std::vector<int32_t>& pages = seqs_.find(ids[r])->second.pages;
    int32_t* row = table.data() + r * max_blocks;
    std::copy(pages.begin(), pages.end(), row);
    std::fill(row + pages.size(), row + max_blocks, -1);
  }
  return ok_status();
}

KvLayerMemory KvPagePool::layer(int64_t l) const {
  GB_CHECK(l >= 0 && l < geometry_.num_layers, "KvPagePool::layer: layer out of range");
  const size_t b = kBuffersPerLayer * static_cast<size_t>(l);
  return {buffers_[b].get(),     buffers_[b + 1].get(), buffers_[b + 2].get(), buffers_[b + 3].get(),
          buffers_[b + 4].get(), buffers_[b + 5].get(), buffers_[b + 6].get(), buffers_[b + 7].get()};
}

int32_t KvPagePool::state_slot(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? -1 : it->second.state_slot;
}

StateLayerMemory KvPagePool::state_layer(int64_t l) const {
  GB_CHECK(l >= 0 && l < geometry_.state.num_layers(), "KvPagePool::state_layer: layer out of range");
  StateLayerMemory m;
  if (state_buffers_.empty()) return m;
  for (int r = 0; r < kStateRegions; ++r)
    m.region[r] = state_buffers_[kStateRegions * static_cast<size_t>(l) + r].get();
  return m;
}

int64_t StateSlotGeometry::layer_bytes(int64_t l) const {
  int64_t n = 0;
  for (int64_t b : layers[static_cast<size_t>(l)]) n += b;
  return n;
}

int64_t StateSlotGeometry::bytes_per_slot() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers(); ++l) n += layer_bytes(l);
  return n;
}

int64_t KvPageGeometry::bytes_per_page() const {
  if (mla_rows_per_page.empty() && indexer_rows_per_page.empty()) {
    return num_layers * page_size *
           (2 * num_kv_heads * (row_bytes + side_row_bytes) + mla_row_bytes + mla_scale_bytes + mla_rope_bytes +
            indexer_row_bytes);
  }
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    n += 2 * num_kv_heads * page_size * (row_bytes + side_row_bytes) +
         mla_rows(l) * (mla_row_bytes + mla_scale_bytes + mla_rope_bytes) + indexer_rows(l) * indexer_row_bytes;
  }
  return n;
}

}  // namespace genbridge::runtime
