// dsinfer engine: the paged KV block pool with a prefix cache (the "DSpark sharded cache
// pool" of --dspark-shard-count). This file is bookkeeping only: it hands out block ids;
// whoever owns the K/V memory (later the paged attention path) stores, for every layer,
// K and V of `block_size` tokens per block id.
//
// Data flow of one request:
//   admit(table, prompt)   the longest run of cached full blocks of the prompt is shared
//                          (ref-counted, read-only); fresh blocks are reserved for the rest;
//                          returns how many prompt tokens are served from the cache.
//   forward                writes K/V of positions [cached, prompt_len) into table.blocks().
//   commit(table, n)       positions [0, n) now hold K/V; full blocks among them become
//                          cache entries keyed by chained hashes (hash(parent, tokens)).
//   append(table, tokens)  reserves slots for a decode/verify step (may return one
//                          copy-on-write copy to apply before the forward writes).
//   truncate(table, len)   speculation rollback: drops whole blocks past the new end.
//   free(table)            completion or cancellation: every reference dropped at once.
// Blocks whose last reference goes stay in an LRU while they are cache entries and are
// evicted only when a fresh block is needed; other blocks go straight to the free list.
//
// Sharding: the pool is split into shard_count shards, each a contiguous id range with
// its own mutex, free list, LRU and cache index. A table's home shard is picked from a
// fingerprint of its prompt (hash of the first full block), so requests with the same
// prefix meet in one shard, where that prefix's cache entries live. Allocation order: home
// free list, other shards' free lists, home LRU, other shards' LRUs, failure. So nothing
// cached is evicted while any shard has a free block (the pool behaves like one global
// pool for eviction) and a full shard borrows before the request sees out-of-memory.
//
// Threading: every operation on different tables may run concurrently. One table is used
// by one thread at a time. An operation holds at most one shard lock at a time; the
// whole-pool operations (compact, check_invariants, clear_cache, largest_cached_prefixes)
// take all shard locks in index order, so nothing can deadlock. Out-of-blocks is a return
// value (never an exception) so the scheduler can preempt; dsinfer::Error is only thrown
// for misuse (bad length, table used before admit, ...).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dsinfer {

// Shape of one block's K/V storage, for sizing the pool from a memory budget.
struct KVLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;         // tokens per block
  DType dtype = DType::F32;    // element type of the stored K/V
  // Elements of K (or of V) of one block in one layer: [n_kv_heads][block_size][head_dim].
  int64_t block_elems() const { return static_cast<int64_t>(n_kv_heads) * block_size * head_dim; }
  // 2 (K and V) x layers x kv_heads x head_dim x block_size x sizeof(dtype).
  uint64_t bytes_per_block() const;
};

// --cache-prealloc-ratio: the share of `budget_bytes` (the memory left for KV after the
// weights) reserved for the pool at start-up; the rest stays free for activations and
// the drafter. blocks = floor(budget_bytes * ratio / bytes_per_block). Throws Error when
// the ratio is outside (0, 1] or the layout is empty.
int64_t blocks_for_budget(uint64_t budget_bytes, double prealloc_ratio, const KVLayout& layout);
// The --cache-prealloc-ratio rule of every pool sizing: in (0, 1], else Error naming it.
void check_prealloc_ratio(double prealloc_ratio);

struct BlockPoolConfig {
  int64_t num_blocks = 0;  // >= shard_count
  int block_size = 16;     // tokens per block
  int shard_count = 8;     // --dspark-shard-count
  uint64_t hash_seed = 0;  // root of every hash chain (e.g. differs per model / adapter)
  int hash_bits = 64;      // < 64 only in tests: narrows hashes to force collisions
  // false: no prefix cache (admit never matches, commit never makes entries), for models
  // whose decoding state is per sequence and cannot be shared by block (DeepSeek-V4:
  // Model::paged_state_shape). Blocks then only account for memory.
  bool prefix_cache = true;
};

// One K/V copy the storage owner must do before the forward writes the table's new
// positions: positions [0, n_tokens) of block `src` -> block `dst`, in every layer.
struct BlockCopy {
  int32_t src = -1, dst = -1;
  int n_tokens = 0;
};

// compact() renumbering: the storage owner copies block `from` -> `to` (all layers).
// No `to` is ever also a `from`, so moves may be applied in any order or in parallel.
struct BlockMove {
  int32_t from = -1, to = -1;
};

struct AdmitResult {
  bool ok = false;        // false: not enough blocks; the table is left empty
  int cached_tokens = 0;  // prompt tokens whose K/V came from the cache (block-aligned)
};

struct AppendResult {
  bool ok = false;        // false: not enough blocks; the table is unchanged
  BlockCopy copy;         // copy-on-write to apply first (copy.src == -1: none)
  bool has_copy() const { return copy.src >= 0; }
};

struct CompactResult {
  bool ok = false;
  std::string error;                 // why nothing was done (tables did not match)
  int64_t evicted_over_cap = 0;      // idle cache entries dropped to honour the cap
  int64_t evicted_unreachable = 0;   // cache entries whose parent chain is gone
  std::vector<BlockMove> moves;      // old id -> new id; the given tables are remapped
};

struct ShardStats {
  int64_t total = 0;        // blocks in the shard
  int64_t used = 0;         // referenced by at least one table
  int64_t free = 0;         // on the free list
  int64_t cached = 0;       // cache entries (in use or idle)
  int64_t cached_idle = 0;  // cache entries no table holds: the LRU, evictable
  int64_t hit_blocks = 0;   // blocks served from this shard's cache at admission
  int64_t evictions = 0;    // cache entries evicted to make room
  int64_t lent = 0;         // fresh blocks handed to tables whose home is another shard
};

struct PoolStats {
  int block_size = 0;
  std::vector<ShardStats> shards;
  int64_t total = 0, used = 0, free = 0, cached = 0, cached_idle = 0;
  // dspark_cache_hit_ratio = cached_prompt_tokens / prompt_tokens over admitted requests.
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  double hit_ratio = 0.0;
  // Fragmentation: slots reserved by tables but holding no token (the tail of each
  // table's last block) over the slots of all blocks in use.
  int64_t unused_slots = 0, allocated_slots = 0;
  double fragmentation = 0.0;
  int64_t alloc_failures = 0;  // append/admit calls that returned out-of-blocks
  int64_t cow_copies = 0;
  int64_t dedup_swaps = 0;     // committed blocks replaced by an identical cache entry
};

// One cached prefix as cache-stats shows it: a chain of cache entries from the root.
struct CachedPrefix {
  int tokens = 0;                    // prefix length (whole blocks)
  uint64_t hash = 0;                 // chained hash of the last block
  int32_t leaf_block = -1;
  bool in_use = false;               // a table holds the last block
  std::vector<int32_t> head_tokens;  // the first block's token ids (to show the prompt)
};

class BlockPool;

// A sequence's block table: block i holds positions [i*block_size, (i+1)*block_size).
// Owned by the caller (one per request); must not outlive its pool. Destroying a table
// that still holds blocks frees them. Move-only.
class BlockTable {
 public:
  BlockTable() = default;
  ~BlockTable();
  BlockTable(BlockTable&& o) noexcept;
  BlockTable& operator=(BlockTable&& o) noexcept;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  int length() const { return static_cast<int>(tokens_.size()); }
  int committed() const { return committed_; }
  int home_shard() const { return home_; }
  bool admitted() const { return pool_ != nullptr; }
  std::span<const int32_t> blocks() const { return blocks_; }
  std::span<const int32_t> tokens() const { return tokens_; }

 private:
  friend class BlockPool;
  void reset_fields();

  BlockPool* pool_ = nullptr;  // set by admit, cleared by free
  int home_ = -1;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> tokens_;    // token ids of positions [0, length)
  std::vector<uint64_t> hashes_;   // chained hashes of the leading committed full blocks
  int committed_ = 0;
  // Source of the last copy-on-write: kept referenced until the next pool call on this
  // table, so nobody can reuse it before the caller has copied from it.
  int32_t pending_src_ = -1;
};

class BlockPool {
 public:
  explicit BlockPool(const BlockPoolConfig& cfg);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int shard_count() const { return static_cast<int>(shards_.size()); }
  int shard_of(int32_t block) const;

  // Chained block hash: hash(parent, tokens of the block). parent of block 0 = hash_seed.
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const;
  // Home shard of a prompt (fingerprint = hash of its first full block, or of all its
  // tokens when shorter than a block).
  int route(std::span<const int32_t> prompt) const;

  // Starts a sequence. `table` must be empty. Shares the longest run of cached full
  // blocks among the first prompt.size() - 1 tokens (the last prompt token is always
  // computed, so the forward yields its logits), reserves blocks for the rest, and
  // counts the tokens for the hit ratio. All-or-nothing.
  AdmitResult admit(BlockTable& table, std::span<const int32_t> prompt);
  // Reserves slots for `tokens` at positions [length, length + n). All-or-nothing. When
  // the last block is partial and shared, it is replaced by a fresh one and the result
  // names the copy to do first; a partial block only this table holds that is still a
  // cache entry is taken out of the cache and written in place.
  AppendResult append(BlockTable& table, std::span<const int32_t> tokens);
  // Marks positions [0, n) as holding K/V (n <= length); full blocks among them become
  // cache entries. A block whose twin (same tokens, same parent) is already cached is
  // replaced in the table by the twin (dedup): re-read blocks() after commit.
  void commit(BlockTable& table, int n);
  // Speculation rollback to new_length <= length: whole blocks past the end are dropped;
  // a shared block the end falls into is kept untouched (append copies it on write).
  void truncate(BlockTable& table, int new_length);
  // Drops every reference of the table at once and leaves it empty (not admitted).
  void free(BlockTable& table);

  // Fresh blocks `append` would need to add n_tokens to the table (copy-on-write included).
  int64_t blocks_needed(const BlockTable& table, int n_tokens) const;
  // Whether n fresh blocks could be had now (free + evictable). Advisory under
  // concurrency: admit/append remain the authority.
  bool can_allocate(int64_t n) const;
  // Prompt tokens admit() would serve from the cache now (no references taken); the
  // hit-rate scheduler policy ranks waiting requests with it.
  int peek_cached_tokens(std::span<const int32_t> prompt) const;

  PoolStats stats() const;
  std::vector<CachedPrefix> largest_cached_prefixes(int k) const;

  // --enable-cache-defrag, run when idle: (1) drops cache entries that can never be hit
  // again (their parent chain was evicted), (2) evicts the least recently used idle
  // entries until at most `max_idle_cached` remain (-1: no cap), (3) renumbers live
  // blocks to the low end of each shard. `live_tables` must be every table holding
  // blocks, none in use by another thread; they are remapped here, and the returned
  // moves are what the storage owner copies. When the tables do not account for every
  // reference, nothing is changed and ok is false.
  CompactResult compact(std::span<BlockTable* const> live_tables, int64_t max_idle_cached = -1);

  // Drops every cache entry (idle ones return to the free list).
  void clear_cache();

  // Checks every internal invariant against the given tables (which must be all tables
  // holding blocks): each block is free, or an idle cache entry in the LRU, or referenced
  // with refcount == number of table slots holding it; lists and index agree; counters
  // agree. Returns "" when all hold, else what failed. For tests and debug builds.
  std::string check_invariants(std::span<const BlockTable* const> tables) const;

 private:
  struct Shard;
  struct Block;

  int32_t alloc_block(int home);
  bool alloc_blocks(int home, int64_t n, std::vector<int32_t>& out);
  void release_block(int32_t id);
  void release_blocks_reverse(std::span<const int32_t> ids);
  void release_pending(BlockTable& t);
  void require_admitted(const BlockTable& t, const char* what) const;
  void account(int64_t slots_delta, int64_t tokens_delta);
  // Looks up block `index` of a chain (key = hash, verified by tokens and the parent's
  // entry serial). When `take_ref`, takes a reference. Returns the block or -1.
  int32_t lookup(uint64_t hash, std::span<const int32_t> tokens, uint64_t parent_serial, int first_shard,
                 bool take_ref, uint64_t* serial_out, int* shard_out) const;
  // Under the shard lock: removes a cache entry (index, flag).
  void uncache_locked(Shard& s, int32_t local);
  int32_t evict_lru_locked(Shard& s);

  int block_size_;
  int64_t num_blocks_;
  uint64_t hash_seed_;
  bool prefix_cache_;
  uint64_t hash_mask_;
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t shard_q_, shard_r_;  // shard sizes: the first r shards hold q + 1 blocks

  mutable std::atomic<uint64_t> next_serial_{1};
  mutable std::atomic<uint64_t> tick_{1};
  std::atomic<int64_t> prompt_tokens_{0}, cached_prompt_tokens_{0};
  std::atomic<int64_t> table_slots_{0}, table_tokens_{0};
  std::atomic<int64_t> alloc_failures_{0}, cow_copies_{0}, dedup_swaps_{0};
};

}  // namespace dsinfer
