// Tests of src/engine/block_pool: the paged KV block pool and its prefix cache.
//
// Every test that shares blocks also runs a simulated K/V store (SimKV): one 64-bit value
// per (block, slot), written like a forward pass would write K/V, i.e. a signature of the
// whole token prefix ending at that position. Reading a table back through its block ids
// must give exactly its own prefix signatures; that catches a cache hit on wrong tokens,
// a write into a shared block, a lost copy-on-write and a wrong compaction remap. Random
// tests use a fixed-seed generator and call check_invariants after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/block_pool.h"

using namespace dsinfer;

namespace {

using Tokens = std::vector<int32_t>;

// Deterministic on every platform (unlike std:: distributions).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int uniform(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }  // [0, n)
  bool chance(int percent) { return uniform(100) < percent; }
};

// Simulated per-slot K/V: value = signature of tokens[0..pos].
struct SimKV {
  int bs;
  std::vector<uint64_t> slot;
  explicit SimKV(const BlockPool& p) : bs(p.block_size()), slot(p.num_blocks() * p.block_size(), 0) {}

  static uint64_t step(uint64_t prev, int32_t tok) {
    uint64_t h = prev ^ static_cast<uint32_t>(tok);
    h *= 0x100000001b3ull;
    return h ^ (h >> 29);
  }
  uint64_t& at(int32_t block, int off) { return slot[static_cast<size_t>(block) * bs + off]; }

  void apply(const AppendResult& r) {
    if (!r.has_copy()) return;
    for (int i = 0; i < r.copy.n_tokens; ++i) at(r.copy.dst, i) = at(r.copy.src, i);
  }
  void apply(const std::vector<BlockMove>& moves) {
    for (const BlockMove& m : moves)
      for (int i = 0; i < bs; ++i) at(m.to, i) = at(m.from, i);
  }
  // The "forward": writes K/V of positions [from, length).
  void write(const BlockTable& t, int from) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int p = 0; p < t.length(); ++p) {
      h = step(h, t.tokens()[p]);
      if (p >= from) at(t.blocks()[p / bs], p % bs) = h;
    }
  }
  ::testing::AssertionResult verify(const BlockTable& t) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int p = 0; p < t.length(); ++p) {
      h = step(h, t.tokens()[p]);
      if (at(t.blocks()[p / bs], p % bs) != h)
        return ::testing::AssertionFailure() << "position " << p << " (block " << t.blocks()[p / bs] << ") holds other K/V";
    }
    return ::testing::AssertionSuccess();
  }
};

// Admission + prefill + commit of the whole prompt, as the engine will do it.
AdmitResult prefill(BlockPool& pool, SimKV& kv, BlockTable& t, const Tokens& prompt, bool commit = true) {
  AdmitResult r = pool.admit(t, prompt);
  if (r.ok) {
    kv.write(t, r.cached_tokens);
    if (commit) pool.commit(t, t.length());
  }
  return r;
}

// Decode/verify step: reserve, copy-on-write, forward.
bool extend(BlockPool& pool, SimKV& kv, BlockTable& t, const Tokens& toks) {
  const int from = t.length();
  AppendResult r = pool.append(t, toks);
  if (!r.ok) return false;
  kv.apply(r);
  kv.write(t, from);
  return true;
}

Tokens seq(int32_t start, int n) {
  Tokens v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

Tokens cat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string invariants(const BlockPool& pool, std::initializer_list<const BlockTable*> tables) {
  std::vector<const BlockTable*> v(tables);
  return pool.check_invariants(v);
}

BlockPoolConfig cfg(int64_t blocks, int bs, int shards) {
  BlockPoolConfig c;
  c.num_blocks = blocks;
  c.block_size = bs;
  c.shard_count = shards;
  return c;
}

}  // namespace

TEST(BlockPoolSizing, BytesPerBlockAndBudget) {
  // Qwen3-8B: 36 layers, 8 KV heads, head dim 128, 16-token blocks.
  KVLayout l{36, 8, 128, 16, DType::F32};
  EXPECT_EQ(l.bytes_per_block(), 2ull * 36 * 8 * 128 * 16 * 4);  // 4.5 MiB
  EXPECT_EQ(l.block_elems(), 8 * 16 * 128);
  const uint64_t budget = 40ull << 30;
  EXPECT_EQ(blocks_for_budget(budget, 0.7, l), static_cast<int64_t>(40.0 * 1024 * 0.7 / 4.5));  // floor: 6371
  l.dtype = DType::BF16;
  EXPECT_EQ(l.bytes_per_block(), 2ull * 36 * 8 * 128 * 16 * 2);
  EXPECT_EQ(blocks_for_budget(budget, 0.7, l), 12743);
  EXPECT_EQ(blocks_for_budget(1000, 1.0, KVLayout{1, 1, 1, 16, DType::F32}), 7);  // 1000 / 128, floored
  EXPECT_THROW(blocks_for_budget(budget, 0.0, l), Error);
  EXPECT_THROW(blocks_for_budget(budget, 1.5, l), Error);
  EXPECT_THROW(blocks_for_budget(budget, 0.5, KVLayout{}), Error);
}

TEST(BlockPool, RejectsBadConfig) {
  EXPECT_THROW(BlockPool(cfg(4, 16, 8)), Error);  // fewer blocks than shards
  EXPECT_THROW(BlockPool(cfg(64, 0, 1)), Error);
  EXPECT_THROW(BlockPool(cfg(64, 16, 0)), Error);
  try {
    BlockPool p(cfg(5, 16, 8));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dspark-shard-count"), std::string::npos);
  }
  BlockPool p(cfg(10, 4, 3));  // uneven shards: 4, 3, 3
  const PoolStats s = p.stats();
  ASSERT_EQ(s.shards.size(), 3u);
  EXPECT_EQ(s.shards[0].total, 4);
  EXPECT_EQ(s.shards[2].total, 3);
  EXPECT_EQ(p.shard_of(3), 0);
  EXPECT_EQ(p.shard_of(4), 1);
  EXPECT_EQ(p.shard_of(9), 2);
}

TEST(BlockPool, MisuseThrowsError) {
  BlockPool pool(cfg(8, 4, 1));
  BlockTable t;
  EXPECT_THROW(pool.append(t, seq(0, 2)), Error);
  ASSERT_TRUE(pool.admit(t, seq(0, 5)).ok);
  EXPECT_THROW(pool.admit(t, seq(0, 5)), Error);
  EXPECT_THROW(pool.truncate(t, 6), Error);
  EXPECT_THROW(pool.truncate(t, -1), Error);
  EXPECT_THROW(pool.commit(t, 6), Error);
  BlockPool other(cfg(8, 4, 1));
  EXPECT_THROW(other.truncate(t, 1), Error);
  EXPECT_EQ(invariants(pool, {&t}), "");
}

TEST(BlockPool, AppendAllocatesWholeBlocksAndReportsFragmentation) {
  BlockPool pool(cfg(10, 4, 1));
  SimKV kv(pool);
  BlockTable t;
  AdmitResult a = prefill(pool, kv, t, seq(100, 6));
  ASSERT_TRUE(a.ok);
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_EQ(t.blocks().size(), 2u);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.used, 2);
  EXPECT_EQ(s.free, 8);
  EXPECT_EQ(s.allocated_slots, 8);
  EXPECT_EQ(s.unused_slots, 2);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.25);
  ASSERT_TRUE(extend(pool, kv, t, {1, 2}));
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_DOUBLE_EQ(pool.stats().fragmentation, 0.0);
  ASSERT_TRUE(extend(pool, kv, t, {3}));
  EXPECT_EQ(t.blocks().size(), 3u);
  EXPECT_EQ(pool.stats().unused_slots, 3);
  EXPECT_TRUE(kv.verify(t));
  EXPECT_EQ(invariants(pool, {&t}), "");
  pool.free(t);
  EXPECT_FALSE(t.admitted());
  EXPECT_EQ(pool.stats().used, 0);
  EXPECT_EQ(invariants(pool, {&t}), "");
}

TEST(BlockPool, PrefixHitSharesCommittedBlocks) {
  BlockPool pool(cfg(32, 4, 2));
  SimKV kv(pool);
  const Tokens a_prompt = seq(1, 10);  // 2 full blocks + 2
  BlockTable a, b;
  ASSERT_TRUE(prefill(pool, kv, a, a_prompt).ok);
  EXPECT_EQ(pool.stats().cached, 2);
  const Tokens b_prompt = cat(seq(1, 8), seq(500, 5));
  EXPECT_EQ(pool.peek_cached_tokens(b_prompt), 8);
  AdmitResult r = prefill(pool, kv, b, b_prompt, /*commit=*/false);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.cached_tokens, 8);
  EXPECT_EQ(b.committed(), 8);
  EXPECT_EQ(b.blocks()[0], a.blocks()[0]);
  EXPECT_EQ(b.blocks()[1], a.blocks()[1]);
  EXPECT_NE(b.blocks()[2], a.blocks()[2]);
  EXPECT_EQ(b.home_shard(), a.home_shard());
  EXPECT_TRUE(kv.verify(a));
  EXPECT_TRUE(kv.verify(b));
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
  PoolStats s = pool.stats();
  EXPECT_EQ(s.prompt_tokens, 23);
  EXPECT_EQ(s.cached_prompt_tokens, 8);
  EXPECT_DOUBLE_EQ(s.hit_ratio, 8.0 / 23.0);
  EXPECT_EQ(s.used, 3 + 2);  // a: 3 blocks; b: 4 blocks, 2 of them a's
  // Cancellation frees a's KV at once; b's shared blocks stay valid.
  pool.free(a);
  EXPECT_TRUE(kv.verify(b));
  pool.free(b);
  s = pool.stats();
  EXPECT_EQ(s.used, 0);
  EXPECT_EQ(s.cached_idle, 2);
  EXPECT_EQ(s.free + s.cached_idle, s.total);
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
}

TEST(BlockPool, FullPromptHitStillComputesLastToken) {
  BlockPool pool(cfg(16, 4, 1));
  SimKV kv(pool);
  BlockTable a, b, c;
  ASSERT_TRUE(prefill(pool, kv, a, seq(1, 8)).ok);
  EXPECT_EQ(pool.stats().cached, 2);
  // Same 8 tokens: only blocks inside the first 7 tokens are reused, so the last token
  // goes through the forward and yields logits.
  EXPECT_EQ(prefill(pool, kv, b, seq(1, 8)).cached_tokens, 4);
  EXPECT_EQ(prefill(pool, kv, c, seq(1, 9)).cached_tokens, 8);
  EXPECT_TRUE(kv.verify(a));
  EXPECT_TRUE(kv.verify(b));
  EXPECT_TRUE(kv.verify(c));
  EXPECT_EQ(invariants(pool, {&a, &b, &c}), "");
}

TEST(BlockPool, OnlyCommittedFullBlocksAreCached) {
  BlockPool pool(cfg(16, 4, 1));
  SimKV kv(pool);
  BlockTable a;
  ASSERT_TRUE(prefill(pool, kv, a, seq(1, 9), /*commit=*/false).ok);
  EXPECT_EQ(pool.stats().cached, 0);
  pool.commit(a, 5);
  EXPECT_EQ(pool.stats().cached, 1);
  pool.commit(a, 3);  // never lowers
  EXPECT_EQ(a.committed(), 5);
  pool.free(a);
  BlockTable b;
  EXPECT_EQ(prefill(pool, kv, b, seq(1, 10)).cached_tokens, 4);
  EXPECT_TRUE(kv.verify(b));
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
}

TEST(BlockPool, TruncateDropsWholeBlocksOnly) {
  BlockPool pool(cfg(8, 4, 1));
  SimKV kv(pool);
  BlockTable t;
  ASSERT_TRUE(prefill(pool, kv, t, seq(0, 10)).ok);
  const std::vector<int32_t> before(t.blocks().begin(), t.blocks().end());
  pool.truncate(t, 9);
  EXPECT_EQ(t.blocks().size(), 3u);
  pool.truncate(t, 8);
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(t.committed(), 8);
  pool.truncate(t, 5);
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(t.blocks()[1], before[1]);
  EXPECT_TRUE(kv.verify(t));
  EXPECT_EQ(invariants(pool, {&t}), "");
  // Speculation round: draft 6 tokens, accept 2.
  ASSERT_TRUE(extend(pool, kv, t, {7, 7, 7, 7, 7, 7}));
  EXPECT_EQ(t.length(), 11);
  pool.truncate(t, 7);
  pool.commit(t, 7);
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_TRUE(kv.verify(t));
  pool.truncate(t, 0);
  EXPECT_EQ(t.blocks().size(), 0u);
  EXPECT_TRUE(t.admitted());
  EXPECT_EQ(pool.stats().used, 0);
  EXPECT_EQ(invariants(pool, {&t}), "");
}

TEST(BlockPool, CopyOnWriteWhenTruncatedIntoSharedBlock) {
  BlockPool pool(cfg(16, 4, 1));
  SimKV kv(pool);
  BlockTable a, b;
  ASSERT_TRUE(prefill(pool, kv, a, seq(1, 9)).ok);
  ASSERT_EQ(prefill(pool, kv, b, seq(1, 9)).cached_tokens, 8);
  const int32_t shared = a.blocks()[1];
  ASSERT_EQ(b.blocks()[1], shared);
  pool.truncate(b, 6);  // now ends inside the shared block
  EXPECT_EQ(b.blocks()[1], shared);
  EXPECT_EQ(pool.blocks_needed(b, 1), 1);  // the copy
  AppendResult r = pool.append(b, Tokens{77, 78});
  ASSERT_TRUE(r.ok);
  ASSERT_TRUE(r.has_copy());
  EXPECT_EQ(r.copy.src, shared);
  EXPECT_EQ(r.copy.dst, b.blocks()[1]);
  EXPECT_EQ(r.copy.n_tokens, 2);
  EXPECT_NE(b.blocks()[1], shared);
  // The source stays referenced by b until b's next pool call.
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
  kv.apply(r);
  kv.write(b, 6);
  EXPECT_TRUE(kv.verify(a));
  EXPECT_TRUE(kv.verify(b));
  pool.commit(b, 8);
  EXPECT_EQ(pool.stats().cow_copies, 1);
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
  // a's cached prefix is intact.
  BlockTable c;
  EXPECT_EQ(prefill(pool, kv, c, seq(1, 9)).cached_tokens, 8);
  EXPECT_TRUE(kv.verify(c));
  // b's new block 1 was committed as a new entry after the shared block 0.
  BlockTable d;
  EXPECT_EQ(prefill(pool, kv, d, cat(seq(1, 6), {77, 78, 5})).cached_tokens, 8);
  EXPECT_TRUE(kv.verify(d));
  EXPECT_EQ(invariants(pool, {&a, &b, &c, &d}), "");
}

TEST(BlockPool, SoleHolderWritesCachedBlockInPlace) {
  BlockPool pool(cfg(16, 4, 1));
  SimKV kv(pool);
  BlockTable a;
  ASSERT_TRUE(prefill(pool, kv, a, seq(1, 9)).ok);
  EXPECT_EQ(pool.stats().cached, 2);
  const int32_t blk = a.blocks()[1];
  pool.truncate(a, 6);
  AppendResult r = pool.append(a, Tokens{99});
  ASSERT_TRUE(r.ok);
  EXPECT_FALSE(r.has_copy());
  EXPECT_EQ(a.blocks()[1], blk);
  kv.write(a, 6);
  EXPECT_EQ(pool.stats().cached, 1);  // the overwritten block left the cache
  BlockTable b;
  EXPECT_EQ(prefill(pool, kv, b, seq(1, 9)).cached_tokens, 4);
  EXPECT_TRUE(kv.verify(a));
  EXPECT_TRUE(kv.verify(b));
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
}

TEST(BlockPool, LruEvictsOldestOnlyWhenNoFreeBlockIsLeft) {
  BlockPool pool(cfg(6, 2, 1));
  SimKV kv(pool);
  const Tokens p1 = {10, 11, 12}, p2 = {20, 21, 22}, p3 = {30, 31, 32};
  for (const Tokens* p : {&p1, &p2, &p3}) {
    BlockTable t;
    ASSERT_TRUE(prefill(pool, kv, t, *p).ok);
  }  // each table freed by its destructor: 3 idle entries, 3 free blocks
  PoolStats s = pool.stats();
  EXPECT_EQ(s.cached_idle, 3);
  EXPECT_EQ(s.free, 3);
  BlockTable x;
  ASSERT_TRUE(prefill(pool, kv, x, seq(100, 6), false).ok);  // 3 blocks: free ones only
  EXPECT_EQ(pool.stats().cached_idle, 3);
  EXPECT_EQ(pool.stats().shards[0].evictions, 0);
  ASSERT_TRUE(extend(pool, kv, x, {1}));  // needs one more: evicts p1's entry (oldest)
  EXPECT_EQ(pool.stats().shards[0].evictions, 1);
  EXPECT_EQ(pool.peek_cached_tokens(p1), 0);
  EXPECT_EQ(pool.peek_cached_tokens(p2), 2);
  EXPECT_EQ(pool.peek_cached_tokens(p3), 2);
  // A hit takes p2 out of the LRU, so y's own block evicts p3, the only idle entry.
  {
    BlockTable y;
    ASSERT_EQ(prefill(pool, kv, y, p2, false).cached_tokens, 2);
    EXPECT_TRUE(kv.verify(y));
    EXPECT_EQ(pool.stats().shards[0].evictions, 2);
  }  // y's private block returns to the free list, p2 to the LRU
  ASSERT_TRUE(extend(pool, kv, x, {2, 3}));  // takes the free block: no eviction
  EXPECT_EQ(pool.stats().shards[0].evictions, 2);
  EXPECT_EQ(pool.peek_cached_tokens(p2), 2);
  EXPECT_EQ(pool.peek_cached_tokens(p3), 0);
  EXPECT_TRUE(kv.verify(x));
  EXPECT_EQ(invariants(pool, {&x}), "");
}

TEST(BlockPool, DeepestBlocksOfAChainAreEvictedFirst) {
  BlockPool pool(cfg(8, 2, 1));
  SimKV kv(pool);
  const Tokens p = seq(1, 7);  // 3 full blocks + 1
  {
    BlockTable t;
    ASSERT_TRUE(prefill(pool, kv, t, p).ok);
  }
  EXPECT_EQ(pool.peek_cached_tokens(cat(p, {0})), 6);
  BlockTable x;
  ASSERT_TRUE(prefill(pool, kv, x, seq(50, 10), false).ok);  // 5 free blocks
  ASSERT_TRUE(extend(pool, kv, x, {1}));                     // evicts one entry
  EXPECT_EQ(pool.peek_cached_tokens(cat(p, {0})), 4);        // the deepest one went
  ASSERT_TRUE(extend(pool, kv, x, {1, 1}));
  EXPECT_EQ(pool.peek_cached_tokens(cat(p, {0})), 2);
  EXPECT_EQ(invariants(pool, {&x}), "");
}

TEST(BlockPool, FullShardBorrowsFromOthers) {
  BlockPool pool(cfg(8, 2, 2));  // 4 blocks per shard
  SimKV kv(pool);
  BlockTable t;
  const Tokens prompt = seq(3, 12);  // 6 blocks
  ASSERT_TRUE(prefill(pool, kv, t, prompt).ok);
  const int home = t.home_shard();
  EXPECT_EQ(home, pool.route(prompt));
  PoolStats s = pool.stats();
  EXPECT_EQ(s.shards[home].free, 0);
  EXPECT_EQ(s.shards[1 - home].lent, 2);
  EXPECT_EQ(s.shards[home].lent, 0);
  // Borrowed blocks are cache entries in their own shard, and still found.
  pool.free(t);
  BlockTable u;
  EXPECT_EQ(prefill(pool, kv, u, cat(prompt, {1})).cached_tokens, 12);
  EXPECT_TRUE(kv.verify(u));
  EXPECT_EQ(invariants(pool, {&t, &u}), "");
}

TEST(BlockPool, OutOfBlocksIsAReturnValueAndLeavesTheTableUnchanged) {
  BlockPool pool(cfg(4, 4, 1));
  SimKV kv(pool);
  BlockTable t;
  EXPECT_FALSE(pool.can_allocate(5));
  EXPECT_FALSE(pool.admit(t, seq(0, 17)).ok);  // 5 blocks
  EXPECT_FALSE(t.admitted());
  EXPECT_EQ(pool.stats().used, 0);
  ASSERT_TRUE(prefill(pool, kv, t, seq(0, 12)).ok);
  EXPECT_EQ(pool.blocks_needed(t, 5), 2);
  EXPECT_TRUE(pool.can_allocate(1));
  EXPECT_FALSE(pool.can_allocate(2));
  AppendResult r = pool.append(t, seq(50, 5));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(t.length(), 12);
  EXPECT_EQ(t.blocks().size(), 3u);
  EXPECT_EQ(pool.stats().alloc_failures, 2);
  EXPECT_EQ(pool.stats().used, 3);
  EXPECT_TRUE(kv.verify(t));
  EXPECT_EQ(invariants(pool, {&t}), "");
  // Preempting another request (here: truncation) makes room.
  pool.truncate(t, 8);
  EXPECT_TRUE(extend(pool, kv, t, seq(50, 5)));
  EXPECT_EQ(invariants(pool, {&t}), "");
  // A prefix hit failing later in admission returns its shared blocks.
  BlockTable u;
  EXPECT_FALSE(pool.admit(u, cat(seq(0, 8), seq(90, 9))).ok);
  EXPECT_EQ(invariants(pool, {&t, &u}), "");
}

TEST(BlockPool, HashCollisionsNeverShareWrongTokens) {
  for (int bits : {2, 4}) {
    BlockPoolConfig c = cfg(256, 2, 2);
    c.hash_bits = bits;  // every few blocks collide
    BlockPool pool(c);
    SimKV kv(pool);
    Rng rng(7 + bits);
    std::vector<BlockTable> live;
    int hits = 0;
    for (int i = 0; i < 300; ++i) {
      Tokens p(2 + rng.uniform(9));
      for (auto& x : p) x = rng.uniform(3);  // tiny vocabulary: many shared prefixes
      BlockTable t;
      AdmitResult r = prefill(pool, kv, t, p);
      ASSERT_TRUE(r.ok);
      hits += r.cached_tokens > 0;
      ASSERT_TRUE(kv.verify(t)) << "bits " << bits << " step " << i;
      live.push_back(std::move(t));
      if (live.size() > 20) live.erase(live.begin() + rng.uniform(static_cast<int>(live.size())));
      for (const BlockTable& l : live) ASSERT_TRUE(kv.verify(l));
    }
    EXPECT_GT(hits, 20);
    std::vector<const BlockTable*> v;
    for (const auto& l : live) v.push_back(&l);
    EXPECT_EQ(pool.check_invariants(v), "");
  }
}

TEST(BlockPool, ConcurrentIdenticalPromptsDedupOnCommit) {
  BlockPool pool(cfg(16, 4, 1));
  SimKV kv(pool);
  BlockTable a, b;
  const Tokens p = seq(1, 9);
  ASSERT_TRUE(prefill(pool, kv, a, p, false).ok);
  ASSERT_EQ(prefill(pool, kv, b, p, false).cached_tokens, 0);  // nothing committed yet
  EXPECT_EQ(pool.stats().used, 6);
  pool.commit(a, 9);
  pool.commit(b, 9);
  EXPECT_EQ(pool.stats().dedup_swaps, 2);
  EXPECT_EQ(b.blocks()[0], a.blocks()[0]);
  EXPECT_EQ(b.blocks()[1], a.blocks()[1]);
  EXPECT_EQ(pool.stats().used, 4);
  EXPECT_TRUE(kv.verify(b));
  // b's own continuation chains onto the shared entries.
  ASSERT_TRUE(extend(pool, kv, b, {40, 41, 42}));
  pool.commit(b, 12);
  BlockTable c;
  EXPECT_EQ(prefill(pool, kv, c, cat(p, {40, 41, 42, 43})).cached_tokens, 12);
  EXPECT_TRUE(kv.verify(c));
  EXPECT_EQ(invariants(pool, {&a, &b, &c}), "");
}

TEST(BlockPool, SamePrefixRoutesToSameShard) {
  BlockPool pool(cfg(64, 16, 8));
  Rng rng(3);
  Tokens sys(16);
  for (auto& x : sys) x = rng.uniform(1000);
  const int home = pool.route(sys);
  std::set<int> shards;
  for (int i = 0; i < 64; ++i) {
    Tokens user(1 + rng.uniform(40));
    for (auto& x : user) x = rng.uniform(1000);
    EXPECT_EQ(pool.route(cat(sys, user)), home);
    shards.insert(pool.route(user));
  }
  EXPECT_GE(shards.size(), 6u);  // different prefixes spread over the shards
}

TEST(BlockPool, CompactRenumbersLiveBlocksAndRemapsTables) {
  BlockPool pool(cfg(16, 2, 2));
  SimKV kv(pool);
  std::vector<BlockTable> t(6);
  Rng rng(11);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(prefill(pool, kv, t[i], seq(100 * (i % 3), 1 + rng.uniform(4))).ok);
  pool.free(t[1]);
  pool.free(t[4]);
  pool.truncate(t[0], 1);
  std::vector<BlockTable*> live;
  for (auto& x : t) live.push_back(&x);
  const int before_hit = pool.peek_cached_tokens(seq(200, 5));
  CompactResult c = pool.compact(live);
  ASSERT_TRUE(c.ok) << c.error;
  kv.apply(c.moves);
  for (const BlockMove& m : c.moves) {
    EXPECT_EQ(pool.shard_of(m.from), pool.shard_of(m.to));
    EXPECT_LT(m.to, m.from);
  }
  PoolStats s = pool.stats();
  for (int si = 0; si < 2; ++si) {
    const int64_t live_n = s.shards[si].used + s.shards[si].cached_idle;
    for (const auto& x : t)
      for (int32_t b : x.blocks())
        if (pool.shard_of(b) == si) {
          EXPECT_LT(b - si * 8, live_n);
        }
  }
  for (const auto& x : t) EXPECT_TRUE(kv.verify(x));
  std::vector<const BlockTable*> cl(live.begin(), live.end());
  EXPECT_EQ(pool.check_invariants(cl), "");
  EXPECT_EQ(pool.peek_cached_tokens(seq(200, 5)), before_hit);
  // Still fully usable.
  BlockTable u;
  ASSERT_TRUE(prefill(pool, kv, u, seq(200, 5)).ok);
  EXPECT_TRUE(kv.verify(u));
}

TEST(BlockPool, CompactCapsIdleEntriesAndDropsUnreachableOnes) {
  BlockPool pool(cfg(32, 2, 1));
  SimKV kv(pool);
  for (int i = 0; i < 3; ++i) {
    BlockTable t;
    ASSERT_TRUE(prefill(pool, kv, t, seq(1000 * (i + 1), 3)).ok);
  }
  // a: 3 entries; overwriting its middle block strands the third.
  BlockTable a;
  ASSERT_TRUE(prefill(pool, kv, a, seq(1, 7)).ok);
  pool.truncate(a, 3);
  ASSERT_TRUE(extend(pool, kv, a, {9}));
  EXPECT_EQ(pool.stats().cached, 3 + 2);  // a's block 0, its stranded block 2, 3 singles
  std::vector<BlockTable*> live = {&a};
  CompactResult c = pool.compact(live, /*max_idle_cached=*/1);
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_EQ(c.evicted_over_cap, 2);      // the two oldest idle entries
  EXPECT_EQ(c.evicted_unreachable, 1);   // a's stranded block 2
  kv.apply(c.moves);
  EXPECT_EQ(pool.peek_cached_tokens(seq(1000, 3)), 0);
  EXPECT_EQ(pool.peek_cached_tokens(seq(2000, 3)), 0);
  EXPECT_EQ(pool.peek_cached_tokens(seq(3000, 3)), 2);
  EXPECT_TRUE(kv.verify(a));
  EXPECT_EQ(pool.stats().cached, 2);
  std::vector<const BlockTable*> cl = {&a};
  EXPECT_EQ(pool.check_invariants(cl), "");
}

TEST(BlockPool, CompactRefusesAnIncompleteTableList) {
  BlockPool pool(cfg(16, 2, 1));
  SimKV kv(pool);
  BlockTable a, b;
  ASSERT_TRUE(prefill(pool, kv, a, seq(0, 5)).ok);
  ASSERT_TRUE(prefill(pool, kv, b, seq(0, 5)).ok);
  pool.free(a);
  ASSERT_TRUE(prefill(pool, kv, a, seq(50, 3)).ok);
  std::vector<BlockTable*> only_a = {&a};
  CompactResult c = pool.compact(only_a);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("references"), std::string::npos);
  EXPECT_TRUE(c.moves.empty());
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
  EXPECT_TRUE(kv.verify(a));
  EXPECT_TRUE(kv.verify(b));
}

TEST(BlockPool, LargestCachedPrefixes) {
  BlockPool pool(cfg(64, 4, 4));
  SimKV kv(pool);
  const Tokens sys = seq(1, 8);
  {
    BlockTable a, b, c;
    ASSERT_TRUE(prefill(pool, kv, a, cat(sys, seq(100, 9))).ok);  // 4 blocks cached
    ASSERT_TRUE(prefill(pool, kv, b, cat(sys, seq(200, 5))).ok);  // shares 2, adds 1
    ASSERT_TRUE(prefill(pool, kv, c, seq(300, 5)).ok);            // 1 block
  }
  auto top = pool.largest_cached_prefixes(10);
  ASSERT_EQ(top.size(), 3u);  // leaves only: sys is a prefix of two of them
  EXPECT_EQ(top[0].tokens, 16);
  EXPECT_EQ(top[1].tokens, 12);
  EXPECT_EQ(top[2].tokens, 4);
  EXPECT_EQ(top[0].head_tokens, seq(1, 4));
  EXPECT_EQ(top[2].head_tokens, seq(300, 4));
  EXPECT_FALSE(top[0].in_use);
  EXPECT_EQ(pool.largest_cached_prefixes(1).size(), 1u);
}

TEST(BlockPool, ClearCacheReturnsIdleBlocks) {
  BlockPool pool(cfg(16, 2, 2));
  SimKV kv(pool);
  BlockTable a, b;
  ASSERT_TRUE(prefill(pool, kv, a, seq(0, 7)).ok);
  ASSERT_TRUE(prefill(pool, kv, b, seq(40, 7)).ok);
  pool.free(b);
  pool.clear_cache();
  PoolStats s = pool.stats();
  EXPECT_EQ(s.cached, 0);
  EXPECT_EQ(s.used, 4);
  EXPECT_EQ(s.free, 12);
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
  pool.commit(a, 7);  // already committed: nothing new becomes an entry
  pool.free(a);
  EXPECT_EQ(pool.stats().free, 16);
}

TEST(BlockPool, TableDestructorAndMoveReleaseBlocks) {
  BlockPool pool(cfg(8, 4, 1));
  {
    BlockTable t;
    ASSERT_TRUE(pool.admit(t, seq(0, 9)).ok);
    EXPECT_EQ(pool.stats().used, 3);
  }
  EXPECT_EQ(pool.stats().used, 0);
  BlockTable a;
  ASSERT_TRUE(pool.admit(a, seq(0, 5)).ok);
  BlockTable b = std::move(a);
  EXPECT_FALSE(a.admitted());
  EXPECT_TRUE(b.admitted());
  EXPECT_EQ(invariants(pool, {&a, &b}), "");
  BlockTable c;
  ASSERT_TRUE(pool.admit(c, seq(9, 2)).ok);
  c = std::move(b);  // c's old blocks are freed
  EXPECT_EQ(pool.stats().used, 2);
  EXPECT_EQ(invariants(pool, {&a, &b, &c}), "");
}

// ---- random operations -----------------------------------------------------------------

namespace {

// A random workload driver shared by the soak and the threaded test: admissions with
// shared prefixes, decode steps, speculation rounds (draft, accept a prefix, roll back),
// truncations, cancellations, preemption when the pool is full.
struct Driver {
  BlockPool& pool;
  SimKV& kv;
  Rng rng;
  std::vector<Tokens> prefixes;
  std::vector<BlockTable> tables;
  int max_live;
  int64_t admitted = 0, rejected = 0, cached = 0;

  Driver(BlockPool& p, SimKV& k, uint64_t seed, int live, const std::vector<Tokens>& pre)
      : pool(p), kv(k), rng(seed), prefixes(pre), tables(live), max_live(live) {}

  Tokens random_tokens(int n) {
    Tokens v(n);
    for (auto& x : v) x = rng.uniform(50);
    return v;
  }
  BlockTable* pick_live() {
    std::vector<BlockTable*> l;
    for (auto& t : tables)
      if (t.admitted()) l.push_back(&t);
    return l.empty() ? nullptr : l[rng.uniform(static_cast<int>(l.size()))];
  }
  // Frees a random live table (scheduler preemption / cancellation).
  void preempt() {
    if (BlockTable* t = pick_live()) pool.free(*t);
  }

  void step() {
    const int op = rng.uniform(100);
    if (op < 25) {  // admit
      BlockTable* slot = nullptr;
      for (auto& t : tables)
        if (!t.admitted()) slot = &t;
      if (!slot) return preempt();
      const Tokens& pre = prefixes[rng.uniform(static_cast<int>(prefixes.size()))];
      Tokens p(pre.begin(), pre.begin() + rng.uniform(static_cast<int>(pre.size()) + 1));
      p = cat(p, random_tokens(rng.uniform(12)));
      AdmitResult r = pool.admit(*slot, p);
      if (!r.ok) {
        ++rejected;
        return preempt();
      }
      ++admitted;
      cached += r.cached_tokens;
      kv.write(*slot, r.cached_tokens);
      pool.commit(*slot, rng.chance(80) ? slot->length() : rng.uniform(slot->length() + 1));
    } else if (op < 55) {  // speculation round: draft k, accept a, commit
      BlockTable* t = pick_live();
      if (!t) return;
      const int start = t->length();
      const int k = 1 + rng.uniform(6);
      if (!extend(pool, kv, *t, random_tokens(k))) return preempt();
      pool.truncate(*t, start + rng.uniform(k + 1));
      pool.commit(*t, t->length());
    } else if (op < 70) {  // plain decode step
      BlockTable* t = pick_live();
      if (!t) return;
      if (!extend(pool, kv, *t, random_tokens(1))) return preempt();
      if (rng.chance(70)) pool.commit(*t, t->length());
    } else if (op < 82) {  // deep rollback (may land inside shared blocks)
      BlockTable* t = pick_live();
      if (t) pool.truncate(*t, rng.uniform(t->length() + 1));
    } else if (op < 92) {  // cancellation
      preempt();
    } else {  // commit whatever is pending
      BlockTable* t = pick_live();
      if (t) pool.commit(*t, t->length());
    }
  }
  std::vector<const BlockTable*> view() const {
    std::vector<const BlockTable*> v;
    for (const auto& t : tables) v.push_back(&t);
    return v;
  }
};

std::vector<Tokens> make_prefixes(uint64_t seed, int n, int max_len) {
  Rng rng(seed);
  std::vector<Tokens> out(n);
  for (auto& p : out) {
    p.resize(1 + rng.uniform(max_len));
    for (auto& x : p) x = rng.uniform(50);
  }
  return out;
}

}  // namespace

TEST(BlockPool, SoakRandomOperationsKeepInvariants) {
  for (int hash_bits : {64, 4}) {
    for (uint64_t seed : {1, 2, 3}) {
      BlockPoolConfig c = cfg(40, 4, 4);
      c.hash_bits = hash_bits;
      BlockPool pool(c);
      SimKV kv(pool);
      Driver d(pool, kv, seed, 12, make_prefixes(seed + 100, 5, 60));
      for (int i = 0; i < 4000; ++i) {
        d.step();
        if (i % 500 == 499) {  // idle-time defrag
          std::vector<BlockTable*> live;
          for (auto& t : d.tables) live.push_back(&t);
          CompactResult r = pool.compact(live, d.rng.uniform(20));
          ASSERT_TRUE(r.ok) << r.error;
          kv.apply(r.moves);
        }
        if (i % 1700 == 1699) pool.clear_cache();
        const std::string err = pool.check_invariants(d.view());
        ASSERT_EQ(err, "") << "seed " << seed << " bits " << hash_bits << " step " << i;
        for (const auto& t : d.tables) ASSERT_TRUE(kv.verify(t)) << "seed " << seed << " step " << i;
      }
      const PoolStats s = pool.stats();
      std::printf("soak seed %d bits %d: admitted %lld (rejected %lld), hit ratio %.3f, out-of-blocks %lld, "
                  "cow %lld, dedup %lld\n",
                  static_cast<int>(seed), hash_bits, static_cast<long long>(d.admitted),
                  static_cast<long long>(d.rejected), s.hit_ratio, static_cast<long long>(s.alloc_failures),
                  static_cast<long long>(s.cow_copies), static_cast<long long>(s.dedup_swaps));
      EXPECT_GT(d.admitted, 500);
      EXPECT_GT(s.alloc_failures, 20) << "the pool never ran out: no pressure";
      EXPECT_GT(s.cached_prompt_tokens, 0);
      EXPECT_GT(s.cow_copies + s.dedup_swaps, 0);
      int64_t evictions = 0, lent = 0;
      for (const auto& sh : s.shards) evictions += sh.evictions, lent += sh.lent;
      EXPECT_GT(evictions, 0);
      EXPECT_GT(lent, 0);
      for (auto& t : d.tables) pool.free(t);
      EXPECT_EQ(pool.stats().used, 0);
      EXPECT_EQ(pool.check_invariants(d.view()), "");
      pool.clear_cache();
      EXPECT_EQ(pool.stats().free, 40);
    }
  }
}

TEST(BlockPool, ConcurrentOperationsOnDifferentSequences) {
  BlockPool pool(cfg(64, 4, 4));
  SimKV kv(pool);
  const std::vector<Tokens> prefixes = make_prefixes(42, 6, 60);
  std::vector<std::unique_ptr<Driver>> drivers;
  for (int i = 0; i < 4; ++i) drivers.push_back(std::make_unique<Driver>(pool, kv, 1000 + i, 5, prefixes));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (auto& d : drivers)
    threads.emplace_back([&, dp = d.get()] {
      for (int i = 0; i < 10000; ++i) {
        dp->step();
        if (i % 50 == 0) {
          for (const auto& t : dp->tables)
            if (!dp->kv.verify(t)) ++bad;
          pool.stats();  // concurrent readers are fine
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  std::vector<const BlockTable*> all;
  for (auto& d : drivers)
    for (const auto& t : d->tables) {
      all.push_back(&t);
      EXPECT_TRUE(kv.verify(t));
    }
  EXPECT_EQ(pool.check_invariants(all), "");
  int64_t admitted = 0;
  for (auto& d : drivers) admitted += d->admitted;
  const PoolStats s = pool.stats();
  int64_t evictions = 0, lent = 0;
  for (const auto& sh : s.shards) evictions += sh.evictions, lent += sh.lent;
  std::printf("threads: admitted %lld, hit ratio %.3f, out-of-blocks %lld, evictions %lld, lent %lld, cow %lld\n",
              static_cast<long long>(admitted), s.hit_ratio, static_cast<long long>(s.alloc_failures),
              static_cast<long long>(evictions), static_cast<long long>(lent), static_cast<long long>(s.cow_copies));
  EXPECT_GT(admitted, 4000);
  EXPECT_GT(s.cached_prompt_tokens, 0);
  EXPECT_GT(s.alloc_failures, 0);
  EXPECT_GT(evictions, 0);
  for (auto& d : drivers)
    for (auto& t : d->tables) pool.free(t);
  EXPECT_EQ(pool.stats().used, 0);
  EXPECT_EQ(pool.check_invariants(all), "");
  pool.clear_cache();
  EXPECT_EQ(pool.stats().free, 64);
}
