// dsinfer engine: the paged KV block pool and prefix cache (see block_pool.h for the data
// flow and the allocation / borrowing policy).
//
// Per block the shard keeps a refcount (tables holding it), whether it is a cache entry,
// and for entries: the chained hash (index key), the entry's serial (a never-reused id
// given when it entered the cache), the parent entry's serial, its depth in the chain and
// its token ids. A lookup is accepted only when the tokens and the parent serial match,
// so a hash collision can never hand out K/V of other tokens: by induction from the root
// (parent serial 0), a matched chain is exactly the prompt's tokens. Serials, unlike
// block ids, survive compaction and are never reused after eviction.
//
// Block states (checked by check_invariants):
//   free          ref == 0, not an entry, on the shard's free list
//   idle entry    ref == 0, cache entry, in the shard's LRU (evictable)
//   in use        ref > 0 (maybe also an entry), on neither list
#include "engine/block_pool.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace dsinfer {

namespace {

// 64-bit finaliser (xor-shift / multiply rounds): every input bit affects every output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

uint64_t KVLayout::bytes_per_block() const {
  return 2ull * static_cast<uint64_t>(n_layers) * static_cast<uint64_t>(n_kv_heads) * static_cast<uint64_t>(head_dim) *
         static_cast<uint64_t>(block_size) * dtype_size(dtype);
}

void check_prealloc_ratio(double prealloc_ratio) {
  check(prealloc_ratio > 0.0 && prealloc_ratio <= 1.0,
        "--cache-prealloc-ratio must be in (0, 1] (got " + std::to_string(prealloc_ratio) + ")");
}

int64_t blocks_for_budget(uint64_t budget_bytes, double prealloc_ratio, const KVLayout& layout) {
  check_prealloc_ratio(prealloc_ratio);
  check(layout.n_layers > 0 && layout.n_kv_heads > 0 && layout.head_dim > 0 && layout.block_size > 0,
        "KV pool: layout needs layers, kv heads, head dim and block size > 0");
  const long double bytes = static_cast<long double>(budget_bytes) * prealloc_ratio;
  return static_cast<int64_t>(bytes / static_cast<long double>(layout.bytes_per_block()));
}

struct BlockPool::Block {
  int32_t ref = 0;
  bool cached = false;
  int32_t prev = -1, next = -1;  // LRU links (local ids), valid while an idle entry
  int32_t depth = 0;             // block index within its chain
  uint64_t hash = 0, serial = 0, parent_serial = 0;
  uint64_t last_use = 0;         // tick when it last became idle
};

struct BlockPool::Shard {
  mutable std::mutex mu;
  int32_t base = 0, size = 0;
  std::vector<Block> blocks;
  std::vector<int32_t> tokens;  // [size][block_size]: token ids of cache entries
  std::vector<int32_t> free;    // local ids; back() is handed out first (low ids first)
  int32_t lru_head = -1, lru_tail = -1;  // head = least recently used
  int64_t lru_size = 0, used = 0, cached = 0;
  std::unordered_map<uint64_t, int32_t> index;  // chained hash -> local id
  int64_t hit_blocks = 0, evictions = 0, lent = 0;

  const int32_t* toks(int32_t l, int bs) const { return tokens.data() + static_cast<int64_t>(l) * bs; }
  int32_t* toks(int32_t l, int bs) { return tokens.data() + static_cast<int64_t>(l) * bs; }

  void lru_push_back(int32_t l) {
    Block& b = blocks[l];
    b.prev = lru_tail;
    b.next = -1;
    if (lru_tail >= 0) blocks[lru_tail].next = l; else lru_head = l;
    lru_tail = l;
    ++lru_size;
  }
  void lru_remove(int32_t l) {
    Block& b = blocks[l];
    if (b.prev >= 0) blocks[b.prev].next = b.next; else lru_head = b.next;
    if (b.next >= 0) blocks[b.next].prev = b.prev; else lru_tail = b.prev;
    b.prev = b.next = -1;
    --lru_size;
  }
};

// ---- BlockTable -----------------------------------------------------------------------

void BlockTable::reset_fields() {
  pool_ = nullptr;
  home_ = -1;
  blocks_.clear();
  tokens_.clear();
  hashes_.clear();
  committed_ = 0;
  pending_src_ = -1;
}

BlockTable::~BlockTable() {
  if (pool_) pool_->free(*this);
}

BlockTable::BlockTable(BlockTable&& o) noexcept
    : pool_(o.pool_), home_(o.home_), blocks_(std::move(o.blocks_)), tokens_(std::move(o.tokens_)),
      hashes_(std::move(o.hashes_)), committed_(o.committed_), pending_src_(o.pending_src_) {
  o.reset_fields();
}

BlockTable& BlockTable::operator=(BlockTable&& o) noexcept {
  if (this != &o) {
    if (pool_) pool_->free(*this);
    pool_ = o.pool_;
    home_ = o.home_;
    blocks_ = std::move(o.blocks_);
    tokens_ = std::move(o.tokens_);
    hashes_ = std::move(o.hashes_);
    committed_ = o.committed_;
    pending_src_ = o.pending_src_;
    o.reset_fields();
  }
  return *this;
}

// ---- construction ---------------------------------------------------------------------

BlockPool::BlockPool(const BlockPoolConfig& cfg)
    : block_size_(cfg.block_size), num_blocks_(cfg.num_blocks), hash_seed_(cfg.hash_seed), prefix_cache_(cfg.prefix_cache) {
  check(cfg.block_size >= 1 && cfg.block_size <= 4096,
        "KV pool: block size must be in [1, 4096] (got " + std::to_string(cfg.block_size) + ")");
  check(cfg.shard_count >= 1 && cfg.shard_count <= 1024,
        "--dspark-shard-count must be in [1, 1024] (got " + std::to_string(cfg.shard_count) + ")");
  check(cfg.num_blocks >= cfg.shard_count,
        "KV pool: " + std::to_string(cfg.num_blocks) + " blocks cannot be split into " + std::to_string(cfg.shard_count) +
            " shards; lower --dspark-shard-count or raise the memory budget / --cache-prealloc-ratio");
  check(cfg.num_blocks <= INT32_MAX, "KV pool: at most 2^31 - 1 blocks (got " + std::to_string(cfg.num_blocks) + ")");
  check(cfg.hash_bits >= 1 && cfg.hash_bits <= 64, "KV pool: hash_bits must be in [1, 64]");
  hash_mask_ = cfg.hash_bits == 64 ? ~0ull : ((1ull << cfg.hash_bits) - 1);
  shard_q_ = cfg.num_blocks / cfg.shard_count;
  shard_r_ = cfg.num_blocks % cfg.shard_count;
  int32_t base = 0;
  for (int i = 0; i < cfg.shard_count; ++i) {
    auto s = std::make_unique<Shard>();
    s->base = base;
    s->size = static_cast<int32_t>(shard_q_ + (i < shard_r_ ? 1 : 0));
    s->blocks.resize(s->size);
    s->tokens.assign(static_cast<size_t>(s->size) * block_size_, 0);
    s->free.reserve(s->size);
    for (int32_t l = s->size - 1; l >= 0; --l) s->free.push_back(l);
    base += s->size;
    shards_.push_back(std::move(s));
  }
}

BlockPool::~BlockPool() = default;

int BlockPool::shard_of(int32_t block) const {
  const int64_t big = shard_r_ * (shard_q_ + 1);  // ids held by the first r (larger) shards
  if (block < big) return static_cast<int>(block / (shard_q_ + 1));
  return static_cast<int>(shard_r_ + (block - big) / shard_q_);
}

uint64_t BlockPool::chain_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) h = mix64(h + 0x9e3779b97f4a7c15ull + static_cast<uint32_t>(t));
  return mix64(h ^ tokens.size()) & hash_mask_;
}

int BlockPool::route(std::span<const int32_t> prompt) const {
  const size_t n = std::min<size_t>(prompt.size(), block_size_);
  const uint64_t fp = mix64(chain_hash(hash_seed_, prompt.subspan(0, n)));
  return static_cast<int>(fp % shards_.size());
}

void BlockPool::account(int64_t slots_delta, int64_t tokens_delta) {
  table_slots_.fetch_add(slots_delta, std::memory_order_relaxed);
  table_tokens_.fetch_add(tokens_delta, std::memory_order_relaxed);
}

void BlockPool::require_admitted(const BlockTable& t, const char* what) const {
  if (t.pool_ != this) throw Error(std::string("KV pool ") + what + ": the table was not admitted to this pool");
}

// ---- allocation and release -----------------------------------------------------------

void BlockPool::uncache_locked(Shard& s, int32_t l) {
  Block& b = s.blocks[l];
  auto it = s.index.find(b.hash);
  if (it != s.index.end() && it->second == l) s.index.erase(it);
  b.cached = false;
  b.serial = 0;
  --s.cached;
}

int32_t BlockPool::evict_lru_locked(Shard& s) {
  const int32_t l = s.lru_head;
  s.lru_remove(l);
  uncache_locked(s, l);
  ++s.evictions;
  return l;
}

// Policy (see block_pool.h): free blocks anywhere before any eviction, the home shard
// first each time; then the least recently used idle entry, home shard first. One shard
// lock at a time.
int32_t BlockPool::alloc_block(int home) {
  const int n = shard_count();
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < n; ++k) {
      Shard& s = *shards_[(home + k) % n];
      std::lock_guard<std::mutex> g(s.mu);
      int32_t l = -1;
      if (pass == 0) {
        if (s.free.empty()) continue;
        l = s.free.back();
        s.free.pop_back();
      } else {
        if (s.lru_head < 0) continue;
        l = evict_lru_locked(s);
      }
      s.blocks[l].ref = 1;
      ++s.used;
      if (k > 0) ++s.lent;
      return s.base + l;
    }
  }
  return -1;
}

bool BlockPool::alloc_blocks(int home, int64_t n, std::vector<int32_t>& out) {
  out.clear();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = alloc_block(home);
    if (id < 0) {
      release_blocks_reverse(out);
      out.clear();
      return false;
    }
    out.push_back(id);
  }
  return true;
}

void BlockPool::release_block(int32_t id) { release_blocks_reverse(std::span<const int32_t>(&id, 1)); }

// Releases the last block first: when they become idle entries, the deepest block of a
// chain enters the LRU first and is therefore evicted before its parents (evicting a
// parent first would strand the children, which can no longer be matched).
void BlockPool::release_blocks_reverse(std::span<const int32_t> ids) {
  std::unique_lock<std::mutex> lk;
  int cur = -1;
  for (size_t i = ids.size(); i-- > 0;) {
    const int32_t id = ids[i];
    const int si = shard_of(id);
    Shard& s = *shards_[si];
    if (si != cur) {
      if (lk.owns_lock()) lk.unlock();
      lk = std::unique_lock<std::mutex>(s.mu);
      cur = si;
    }
    const int32_t l = id - s.base;
    Block& b = s.blocks[l];
    if (--b.ref > 0) continue;
    --s.used;
    if (b.cached) {
      b.last_use = tick_.fetch_add(1, std::memory_order_relaxed);
      s.lru_push_back(l);
    } else {
      s.free.push_back(l);
    }
  }
}

void BlockPool::release_pending(BlockTable& t) {
  if (t.pending_src_ >= 0) {
    const int32_t id = t.pending_src_;
    t.pending_src_ = -1;
    release_block(id);
  }
}

// ---- prefix lookup ----------------------------------------------------------------------

int32_t BlockPool::lookup(uint64_t hash, std::span<const int32_t> tokens, uint64_t parent_serial, int first_shard,
                          bool take_ref, uint64_t* serial_out, int* shard_out) const {
  const int n = static_cast<int>(shards_.size());
  for (int k = 0; k < n; ++k) {
    const int si = (first_shard + k) % n;
    Shard& s = *shards_[si];
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.index.find(hash);
    if (it == s.index.end()) continue;
    const int32_t l = it->second;
    Block& b = s.blocks[l];
    if (b.parent_serial != parent_serial) continue;  // collision or stale chain
    if (!std::equal(tokens.begin(), tokens.end(), s.toks(l, block_size_))) continue;  // collision
    if (take_ref) {
      if (b.ref == 0) {
        s.lru_remove(l);
        ++s.used;
      }
      ++b.ref;
      ++s.hit_blocks;
    }
    *serial_out = b.serial;
    *shard_out = si;
    return s.base + l;
  }
  return -1;
}

int BlockPool::peek_cached_tokens(std::span<const int32_t> prompt) const {
  if (prompt.empty() || !prefix_cache_) return 0;
  const int64_t matchable = static_cast<int64_t>(prompt.size() - 1) / block_size_;
  uint64_t parent_hash = hash_seed_, parent_serial = 0;
  int hint = route(prompt);
  int64_t i = 0;
  for (; i < matchable; ++i) {
    auto toks = prompt.subspan(i * block_size_, block_size_);
    const uint64_t h = chain_hash(parent_hash, toks);
    uint64_t serial = 0;
    int sh = hint;
    if (lookup(h, toks, parent_serial, hint, false, &serial, &sh) < 0) break;
    parent_hash = h;
    parent_serial = serial;
    hint = sh;
  }
  return static_cast<int>(i * block_size_);
}

// ---- sequence operations ------------------------------------------------------------------

AdmitResult BlockPool::admit(BlockTable& t, std::span<const int32_t> prompt) {
  if (t.pool_ != nullptr || !t.blocks_.empty()) throw Error("KV pool admit: the table already holds a sequence");
  check(prompt.size() < static_cast<size_t>(INT_MAX), "KV pool admit: prompt too long");
  t.reset_fields();
  t.pool_ = this;
  t.home_ = route(prompt);

  // Longest run of cached full blocks within the first size - 1 tokens.
  const int64_t matchable = prompt.empty() || !prefix_cache_ ? 0 : static_cast<int64_t>(prompt.size() - 1) / block_size_;
  uint64_t parent_hash = hash_seed_, parent_serial = 0;
  int hint = t.home_;
  for (int64_t i = 0; i < matchable; ++i) {
    auto toks = prompt.subspan(i * block_size_, block_size_);
    const uint64_t h = chain_hash(parent_hash, toks);
    uint64_t serial = 0;
    int sh = hint;
    const int32_t b = lookup(h, toks, parent_serial, hint, true, &serial, &sh);
    if (b < 0) break;
    t.blocks_.push_back(b);
    t.hashes_.push_back(h);
    parent_hash = h;
    parent_serial = serial;
    hint = sh;
  }
  const int cached = static_cast<int>(t.blocks_.size()) * block_size_;
  t.tokens_.assign(prompt.begin(), prompt.begin() + cached);
  t.committed_ = cached;
  account(static_cast<int64_t>(cached), cached);

  const AppendResult r = append(t, prompt.subspan(cached));
  if (!r.ok) {
    release_blocks_reverse(t.blocks_);
    account(-static_cast<int64_t>(cached), -cached);
    t.reset_fields();
    return {};
  }
  prompt_tokens_.fetch_add(static_cast<int64_t>(prompt.size()), std::memory_order_relaxed);
  cached_prompt_tokens_.fetch_add(cached, std::memory_order_relaxed);
  return {true, cached};
}

AppendResult BlockPool::append(BlockTable& t, std::span<const int32_t> tokens) {
  require_admitted(t, "append");
  release_pending(t);
  if (tokens.empty()) return {true, {}};
  const int64_t len = t.length();
  const int64_t n = static_cast<int64_t>(tokens.size());
  check(len + n < INT_MAX, "KV pool append: sequence longer than 2^31 tokens");
  const int off = static_cast<int>(len % block_size_);

  // The partial last block is about to be written: it must be ours alone and not a
  // cache entry (whose content is addressed by its full token run).
  bool cow = false;
  if (off != 0) {
    const int32_t last = t.blocks_.back();
    Shard& s = *shards_[shard_of(last)];
    std::lock_guard<std::mutex> g(s.mu);
    const int32_t l = last - s.base;
    if (s.blocks[l].ref > 1) cow = true;
    else if (s.blocks[l].cached) uncache_locked(s, l);  // sole holder: write in place, no copy
  }
  const int64_t grow = ceil_div(len + n, block_size_) - static_cast<int64_t>(t.blocks_.size());
  std::vector<int32_t> fresh;
  if (!alloc_blocks(t.home_, grow + (cow ? 1 : 0), fresh)) {
    alloc_failures_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  AppendResult r;
  r.ok = true;
  size_t next = 0;
  if (cow) {
    // The table's reference on the shared block moves to pending_src_ until the next
    // call on this table, by which time the caller has copied from it.
    r.copy = {t.blocks_.back(), fresh[0], off};
    t.pending_src_ = t.blocks_.back();
    t.blocks_.back() = fresh[0];
    next = 1;
    cow_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  t.blocks_.insert(t.blocks_.end(), fresh.begin() + next, fresh.end());
  t.tokens_.insert(t.tokens_.end(), tokens.begin(), tokens.end());
  account(grow * block_size_, n);
  return r;
}

void BlockPool::commit(BlockTable& t, int n) {
  require_admitted(t, "commit");
  release_pending(t);
  if (n < 0 || n > t.length())
    throw Error("KV pool commit: " + std::to_string(n) + " not in [0, " + std::to_string(t.length()) + "]");
  if (n <= t.committed_) return;
  t.committed_ = n;
  if (!prefix_cache_) return;
  const size_t full = static_cast<size_t>(n / block_size_);
  for (size_t i = t.hashes_.size(); i < full; ++i) {
    std::span<const int32_t> toks(t.tokens_.data() + i * block_size_, block_size_);
    const uint64_t h = chain_hash(i == 0 ? hash_seed_ : t.hashes_[i - 1], toks);
    t.hashes_.push_back(h);

    // The parent must be a live entry, else this block could never be reached.
    uint64_t parent_serial = 0;
    if (i > 0) {
      const int32_t pb = t.blocks_[i - 1];
      Shard& ps = *shards_[shard_of(pb)];
      std::lock_guard<std::mutex> g(ps.mu);
      const Block& p = ps.blocks[pb - ps.base];
      if (!p.cached || p.hash != t.hashes_[i - 1]) continue;
      parent_serial = p.serial;
    }
    const int32_t id = t.blocks_[i];
    Shard& s = *shards_[shard_of(id)];
    std::lock_guard<std::mutex> g(s.mu);
    const int32_t l = id - s.base;
    Block& b = s.blocks[l];
    if (b.cached) continue;  // came from the cache (or an earlier dedup): already an entry
    auto it = s.index.find(h);
    if (it == s.index.end()) {
      b.cached = true;
      b.hash = h;
      b.serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
      b.parent_serial = parent_serial;
      b.depth = static_cast<int32_t>(i);
      std::copy(toks.begin(), toks.end(), s.toks(l, block_size_));
      s.index.emplace(h, l);
      ++s.cached;
      continue;
    }
    const int32_t e = it->second;
    Block& twin = s.blocks[e];
    if (twin.parent_serial != parent_serial || !std::equal(toks.begin(), toks.end(), s.toks(e, block_size_)))
      continue;  // a different block with the same hash: stays private
    // Same tokens after the same parent: identical K/V. Share the entry, free ours.
    if (twin.ref == 0) {
      s.lru_remove(e);
      ++s.used;
    }
    ++twin.ref;
    if (--b.ref == 0) {
      --s.used;
      s.free.push_back(l);
    }
    t.blocks_[i] = s.base + e;
    dedup_swaps_.fetch_add(1, std::memory_order_relaxed);
  }
}

void BlockPool::truncate(BlockTable& t, int new_length) {
  require_admitted(t, "truncate");
  release_pending(t);
  if (new_length < 0 || new_length > t.length())
    throw Error("KV pool truncate: new length " + std::to_string(new_length) + " not in [0, " +
                std::to_string(t.length()) + "]");
  const size_t keep = static_cast<size_t>(ceil_div(new_length, block_size_));
  const int64_t dropped = static_cast<int64_t>(t.blocks_.size() - keep);
  release_blocks_reverse(std::span<const int32_t>(t.blocks_).subspan(keep));
  account(-dropped * block_size_, -(t.length() - new_length));
  t.blocks_.resize(keep);
  t.tokens_.resize(new_length);
  t.committed_ = std::min(t.committed_, new_length);
  t.hashes_.resize(std::min(t.hashes_.size(), static_cast<size_t>(new_length / block_size_)));
}

void BlockPool::free(BlockTable& t) {
  if (t.pool_ == nullptr) return;
  require_admitted(t, "free");
  release_pending(t);
  release_blocks_reverse(t.blocks_);
  account(-static_cast<int64_t>(t.blocks_.size()) * block_size_, -t.length());
  t.reset_fields();
}

// ---- admission control and statistics -------------------------------------------------------

int64_t BlockPool::blocks_needed(const BlockTable& t, int n_tokens) const {
  if (n_tokens <= 0) return 0;
  const int64_t len = t.length();
  int64_t need = ceil_div(len + n_tokens, block_size_) - static_cast<int64_t>(t.blocks_.size());
  if (len % block_size_ != 0 && t.pool_ == this) {
    const int32_t last = t.blocks_.back();
    const Shard& s = *shards_[shard_of(last)];
    std::lock_guard<std::mutex> g(s.mu);
    if (s.blocks[last - s.base].ref > 1) ++need;
  }
  return need;
}

bool BlockPool::can_allocate(int64_t n) const {
  int64_t avail = 0;
  for (const auto& sp : shards_) {
    std::lock_guard<std::mutex> g(sp->mu);
    avail += static_cast<int64_t>(sp->free.size()) + sp->lru_size;
    if (avail >= n) return true;
  }
  return avail >= n;
}

PoolStats BlockPool::stats() const {
  PoolStats p;
  p.block_size = block_size_;
  for (const auto& sp : shards_) {
    std::lock_guard<std::mutex> g(sp->mu);
    ShardStats s;
    s.total = sp->size;
    s.used = sp->used;
    s.free = static_cast<int64_t>(sp->free.size());
    s.cached = sp->cached;
    s.cached_idle = sp->lru_size;
    s.hit_blocks = sp->hit_blocks;
    s.evictions = sp->evictions;
    s.lent = sp->lent;
    p.total += s.total;
    p.used += s.used;
    p.free += s.free;
    p.cached += s.cached;
    p.cached_idle += s.cached_idle;
    p.shards.push_back(s);
  }
  p.prompt_tokens = prompt_tokens_.load(std::memory_order_relaxed);
  p.cached_prompt_tokens = cached_prompt_tokens_.load(std::memory_order_relaxed);
  p.hit_ratio = p.prompt_tokens ? static_cast<double>(p.cached_prompt_tokens) / p.prompt_tokens : 0.0;
  p.allocated_slots = p.used * block_size_;
  // Slack of each table's last block. A partial block shared by several tables (after a
  // truncation into a cached block) would be counted once per table: clamp.
  p.unused_slots = std::clamp<int64_t>(table_slots_.load(std::memory_order_relaxed) -
                                           table_tokens_.load(std::memory_order_relaxed),
                                       0, p.allocated_slots);
  p.fragmentation = p.allocated_slots ? static_cast<double>(p.unused_slots) / p.allocated_slots : 0.0;
  p.alloc_failures = alloc_failures_.load(std::memory_order_relaxed);
  p.cow_copies = cow_copies_.load(std::memory_order_relaxed);
  p.dedup_swaps = dedup_swaps_.load(std::memory_order_relaxed);
  return p;
}

// ---- whole-pool operations (all shard locks, in index order) ---------------------------------

namespace {

struct EntryRef {
  int shard;
  int32_t local;
  int32_t depth;
  uint64_t serial, parent_serial;
};

// Which cache entries a lookup can still reach: the root ones, and those whose parent
// entry is reachable. Entries sorted by depth so parents are decided first.
std::vector<EntryRef> reachable_entries(const std::vector<EntryRef>& all, std::vector<bool>& reachable,
                                        std::vector<bool>& has_child) {
  std::vector<EntryRef> sorted = all;
  std::sort(sorted.begin(), sorted.end(), [](const EntryRef& a, const EntryRef& b) { return a.depth < b.depth; });
  std::unordered_map<uint64_t, size_t> pos;  // serial -> index in sorted
  pos.reserve(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) pos.emplace(sorted[i].serial, i);
  reachable.assign(sorted.size(), false);
  has_child.assign(sorted.size(), false);
  for (size_t i = 0; i < sorted.size(); ++i) {
    const EntryRef& e = sorted[i];
    if (e.parent_serial == 0) {
      reachable[i] = e.depth == 0;
      continue;
    }
    auto it = pos.find(e.parent_serial);
    if (it == pos.end() || !reachable[it->second] || sorted[it->second].depth != e.depth - 1) continue;
    reachable[i] = true;
    has_child[it->second] = true;
  }
  return sorted;
}

}  // namespace

std::vector<CachedPrefix> BlockPool::largest_cached_prefixes(int k) const {
  std::vector<std::unique_lock<std::mutex>> locks;
  for (const auto& sp : shards_) locks.emplace_back(sp->mu);
  std::vector<EntryRef> all;
  for (int si = 0; si < shard_count(); ++si) {
    const Shard& s = *shards_[si];
    for (int32_t l = 0; l < s.size; ++l)
      if (s.blocks[l].cached) all.push_back({si, l, s.blocks[l].depth, s.blocks[l].serial, s.blocks[l].parent_serial});
  }
  std::vector<bool> reach, child;
  const std::vector<EntryRef> sorted = reachable_entries(all, reach, child);
  std::unordered_map<uint64_t, size_t> pos;
  for (size_t i = 0; i < sorted.size(); ++i) pos.emplace(sorted[i].serial, i);
  std::vector<size_t> leaves;
  for (size_t i = 0; i < sorted.size(); ++i)
    if (reach[i] && !child[i]) leaves.push_back(i);
  std::sort(leaves.begin(), leaves.end(), [&](size_t a, size_t b) {
    if (sorted[a].depth != sorted[b].depth) return sorted[a].depth > sorted[b].depth;
    return sorted[a].serial < sorted[b].serial;
  });
  std::vector<CachedPrefix> out;
  for (size_t i = 0; i < leaves.size() && static_cast<int>(out.size()) < k; ++i) {
    const EntryRef& e = sorted[leaves[i]];
    const Shard& s = *shards_[e.shard];
    CachedPrefix c;
    c.tokens = (e.depth + 1) * block_size_;
    c.hash = s.blocks[e.local].hash;
    c.leaf_block = s.base + e.local;
    c.in_use = s.blocks[e.local].ref > 0;
    size_t r = leaves[i];
    while (sorted[r].parent_serial != 0) r = pos.at(sorted[r].parent_serial);
    const Shard& rs = *shards_[sorted[r].shard];
    const int32_t* tk = rs.toks(sorted[r].local, block_size_);
    c.head_tokens.assign(tk, tk + block_size_);
    out.push_back(std::move(c));
  }
  return out;
}

void BlockPool::clear_cache() {
  std::vector<std::unique_lock<std::mutex>> locks;
  for (const auto& sp : shards_) locks.emplace_back(sp->mu);
  for (const auto& sp : shards_) {
    Shard& s = *sp;
    for (int32_t l = 0; l < s.size; ++l) {
      Block& b = s.blocks[l];
      if (!b.cached) continue;
      b.cached = false;
      b.serial = 0;
      b.prev = b.next = -1;
      if (b.ref == 0) s.free.push_back(l);
    }
    s.index.clear();
    s.cached = 0;
    s.lru_head = s.lru_tail = -1;
    s.lru_size = 0;
  }
}

CompactResult BlockPool::compact(std::span<BlockTable* const> live_tables, int64_t max_idle_cached) {
  std::vector<std::unique_lock<std::mutex>> locks;
  for (const auto& sp : shards_) locks.emplace_back(sp->mu);
  CompactResult res;

  // The tables must account for every reference, or remapping would leave a holder
  // pointing at a moved block.
  std::vector<int32_t> held(num_blocks_, 0);
  for (const BlockTable* t : live_tables) {
    if (t->pool_ != this && !(t->pool_ == nullptr && t->blocks_.empty())) {
      res.error = "compact: a table belongs to another pool";
      return res;
    }
    for (int32_t b : t->blocks_) ++held[b];
    if (t->pending_src_ >= 0) ++held[t->pending_src_];
  }
  for (const auto& sp : shards_)
    for (int32_t l = 0; l < sp->size; ++l)
      if (sp->blocks[l].ref != held[sp->base + l]) {
        res.error = "compact: block " + std::to_string(sp->base + l) + " has " + std::to_string(sp->blocks[l].ref) +
                    " references but the given tables hold " + std::to_string(held[sp->base + l]);
        return res;
      }

  // 1. Entries no lookup can reach any more (parent evicted or overwritten): idle ones are
  // freed, held ones just stop being entries. First, so the cap counts only live entries.
  {
    std::vector<EntryRef> all;
    for (int si = 0; si < shard_count(); ++si) {
      const Shard& s = *shards_[si];
      for (int32_t l = 0; l < s.size; ++l)
        if (s.blocks[l].cached) all.push_back({si, l, s.blocks[l].depth, s.blocks[l].serial, s.blocks[l].parent_serial});
    }
    std::vector<bool> reach, child;
    const std::vector<EntryRef> sorted = reachable_entries(all, reach, child);
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (reach[i]) continue;
      Shard& s = *shards_[sorted[i].shard];
      const int32_t l = sorted[i].local;
      if (s.blocks[l].ref == 0) {
        s.lru_remove(l);
        uncache_locked(s, l);
        s.free.push_back(l);
      } else {
        uncache_locked(s, l);
      }
      ++res.evicted_unreachable;
    }
  }
  // 2. Cap on idle entries: evict the globally least recently used first.
  if (max_idle_cached >= 0) {
    int64_t idle = 0;
    for (const auto& sp : shards_) idle += sp->lru_size;
    while (idle > max_idle_cached) {
      Shard* oldest = nullptr;
      for (const auto& sp : shards_)
        if (sp->lru_head >= 0 && (!oldest || sp->blocks[sp->lru_head].last_use < oldest->blocks[oldest->lru_head].last_use))
          oldest = sp.get();
      oldest->free.push_back(evict_lru_locked(*oldest));
      ++res.evicted_over_cap;
      --idle;
    }
  }
  // 3. Renumber: live blocks (held or cached) at local ids >= live count move into the
  // free ids below it. Sources are all >= live count and destinations all below it.
  std::vector<int32_t> remap(num_blocks_);
  for (int64_t i = 0; i < num_blocks_; ++i) remap[i] = static_cast<int32_t>(i);
  for (const auto& sp : shards_) {
    Shard& s = *sp;
    std::vector<int32_t> lru_order;
    for (int32_t l = s.lru_head; l >= 0; l = s.blocks[l].next) lru_order.push_back(l);
    int32_t live = 0;
    for (int32_t l = 0; l < s.size; ++l) live += (s.blocks[l].ref > 0 || s.blocks[l].cached) ? 1 : 0;
    int32_t hole = 0;
    for (int32_t src = live; src < s.size; ++src) {
      const Block& b = s.blocks[src];
      if (b.ref == 0 && !b.cached) continue;
      while (s.blocks[hole].ref > 0 || s.blocks[hole].cached) ++hole;
      s.blocks[hole] = b;
      std::copy(s.toks(src, block_size_), s.toks(src, block_size_) + block_size_, s.toks(hole, block_size_));
      s.blocks[src] = Block{};
      remap[s.base + src] = s.base + hole;
      res.moves.push_back({s.base + src, s.base + hole});
      ++hole;
    }
    // Rebuild the lists and the index under the new numbering.
    s.lru_head = s.lru_tail = -1;
    s.lru_size = 0;
    for (int32_t l : lru_order) s.lru_push_back(remap[s.base + l] - s.base);
    s.index.clear();
    for (int32_t l = 0; l < s.size; ++l)
      if (s.blocks[l].cached) s.index.emplace(s.blocks[l].hash, l);
    s.free.clear();
    for (int32_t l = s.size - 1; l >= live; --l) s.free.push_back(l);
  }
  for (BlockTable* t : live_tables) {
    for (int32_t& b : t->blocks_) b = remap[b];
    if (t->pending_src_ >= 0) t->pending_src_ = remap[t->pending_src_];
  }
  res.ok = true;
  return res;
}

std::string BlockPool::check_invariants(std::span<const BlockTable* const> tables) const {
  std::vector<std::unique_lock<std::mutex>> locks;
  for (const auto& sp : shards_) locks.emplace_back(sp->mu);
  std::vector<int32_t> held(num_blocks_, 0);
  int64_t slots = 0, toks = 0;
  for (size_t ti = 0; ti < tables.size(); ++ti) {
    const BlockTable& t = *tables[ti];
    const std::string name = "table " + std::to_string(ti) + ": ";
    if (t.pool_ == nullptr) {
      if (!t.blocks_.empty() || !t.tokens_.empty() || t.pending_src_ >= 0) return name + "not admitted but not empty";
      continue;
    }
    if (t.pool_ != this) return name + "belongs to another pool";
    if (static_cast<int64_t>(t.blocks_.size()) != ceil_div(t.length(), block_size_))
      return name + std::to_string(t.blocks_.size()) + " blocks for " + std::to_string(t.length()) + " tokens";
    if (t.committed_ > t.length()) return name + "committed past the end";
    if (t.hashes_.size() > static_cast<size_t>(t.committed_ / block_size_)) return name + "hashes past committed blocks";
    for (int32_t b : t.blocks_) {
      if (b < 0 || b >= num_blocks_) return name + "block id out of range";
      ++held[b];
    }
    if (t.pending_src_ >= 0) ++held[t.pending_src_];
    slots += static_cast<int64_t>(t.blocks_.size()) * block_size_;
    toks += t.length();
  }
  if (slots != table_slots_.load() || toks != table_tokens_.load())
    return "slot counters " + std::to_string(table_slots_.load()) + "/" + std::to_string(table_tokens_.load()) +
           " but tables hold " + std::to_string(slots) + "/" + std::to_string(toks);

  for (int si = 0; si < shard_count(); ++si) {
    const Shard& s = *shards_[si];
    const std::string name = "shard " + std::to_string(si) + ": ";
    std::vector<char> on_free(s.size, 0), on_lru(s.size, 0);
    for (int32_t l : s.free) {
      if (l < 0 || l >= s.size) return name + "free id out of range";
      if (on_free[l]++) return name + "block " + std::to_string(s.base + l) + " twice on the free list";
    }
    int64_t n_lru = 0;
    int32_t prev = -1;
    for (int32_t l = s.lru_head; l >= 0; l = s.blocks[l].next) {
      if (l >= s.size || on_lru[l]++) return name + "LRU corrupt";
      if (s.blocks[l].prev != prev) return name + "LRU back link corrupt";
      prev = l;
      ++n_lru;
    }
    if (prev != s.lru_tail || n_lru != s.lru_size) return name + "LRU size/tail mismatch";
    int64_t used = 0, cached = 0;
    for (int32_t l = 0; l < s.size; ++l) {
      const Block& b = s.blocks[l];
      const std::string bn = name + "block " + std::to_string(s.base + l) + ": ";
      if (b.ref != held[s.base + l])
        return bn + "refcount " + std::to_string(b.ref) + " but held " + std::to_string(held[s.base + l]) + " times";
      if (b.ref > 0) ++used;
      if (b.cached) {
        ++cached;
        auto it = s.index.find(b.hash);
        if (it == s.index.end() || it->second != l) return bn + "cache entry missing from the index";
        if (b.serial == 0) return bn + "cache entry without serial";
      }
      const bool want_free = b.ref == 0 && !b.cached, want_lru = b.ref == 0 && b.cached;
      if (on_free[l] != want_free) return bn + (want_free ? "free but not on the free list" : "on the free list but live");
      if (on_lru[l] != want_lru) return bn + (want_lru ? "idle entry not in the LRU" : "in the LRU but not idle");
    }
    if (static_cast<int64_t>(s.index.size()) != cached) return name + "index size != cache entries";
    if (used != s.used || cached != s.cached) return name + "used/cached counters wrong";
    if (static_cast<int64_t>(s.free.size()) + s.lru_size + s.used != s.size) return name + "free + idle + used != total";
  }
  return "";
}

}  // namespace dsinfer
