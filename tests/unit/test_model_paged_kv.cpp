// Model floor: the Qwen3 forward over the paged KV cache (model/paged_kv_cache.h) gives
// bit-identical logits and captured hidden states to the dense cache (memcmp):
//  - several sequences with shuffled, interleaved block ids, block sizes 1, 3, 4, 16, 64,
//    prefill in chunks, token-by-token decode, multi-token verify blocks, speculation
//    rollback (truncate) and re-feeding, head_dim 16 and 8;
//  - a block copied with copy_block (copy-on-write) serves a second sequence that shares
//    the prefix, with the same bits as a fresh dense computation;
//  - bad block ids, lengths and overflows are one-line Errors, the cache unchanged;
//  - in bf16 matmul precision over BF16 weights both caches hold BF16 K/V (Model::kv_dtype)
//    and the paged forward still equals the dense one bit for bit (head_dim 64: the
//    grouped vdpbf16ps kernels; 16: the per-row reference), a token's logits do not depend
//    on the other sequences of the batch, copy_block moves BF16 blocks, and f32 precision
//    (or F32 weights) keeps F32 K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/paged_kv_cache.h"
#include "model_test_util.h"

using namespace dsinfer;
using namespace dsinfer::test;

namespace {

std::vector<int32_t> make_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

std::unique_ptr<PagedKVCache> make_paged(const Model& m, int block_size, int64_t blocks, int slots, int max_tokens) {
  const ModelConfig& c = m.config();
  return std::make_unique<PagedKVCache>(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, block_size, blocks,
                                        slots, max_tokens, m.kv_dtype());
}

// One step of a plan: (sequence, tokens to append, rows to roll back afterwards).
struct Step {
  int seq, n, rollback;
};

// Runs the plan on a dense cache and on a paged cache (each sequence's blocks taken from a
// shuffled id list, so sequences interleave in memory) and compares every logits row and
// captured row bit for bit.
void expect_paged_equals_dense(Model& model, int block_size, const std::vector<std::vector<int32_t>>& seqs,
                               const std::vector<Step>& plan, uint32_t seed) {
  const int S = static_cast<int>(seqs.size()), max_len = 64;
  auto dense = model.make_kv_cache(S, max_len);
  const int per_seq = (max_len + block_size - 1) / block_size;
  auto paged = make_paged(model, block_size, int64_t{S} * per_seq + 5, S, max_len);
  std::vector<int32_t> ids(static_cast<size_t>(S * per_seq + 5));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(S));
  for (int i = 0; i < S * per_seq; ++i) tables[static_cast<size_t>(i % S)].push_back(ids[static_cast<size_t>(i)]);
  std::vector<int> len(static_cast<size_t>(S), 0);
  for (const Step& st : plan) {
    ForwardBatch b;
    b.capture_layers = {-1, 0};
    const int start = len[static_cast<size_t>(st.seq)];
    ForwardEntry e;
    e.slot = st.seq;
    e.tokens.assign(seqs[static_cast<size_t>(st.seq)].begin() + start, seqs[static_cast<size_t>(st.seq)].begin() + start + st.n);
    for (int r = 0; r < st.n; ++r) e.logit_rows.push_back(r);
    b.entries.push_back(e);
    ForwardOutput od, op;
    model.forward(*dense, b, od);
    paged->bind(st.seq, tables[static_cast<size_t>(st.seq)], start);
    model.forward(*paged, b, op);
    ASSERT_EQ(od.logits.size(), op.logits.size());
    EXPECT_EQ(0, std::memcmp(od.logits.data(), op.logits.data(), od.logits.size() * sizeof(float)))
        << "block " << block_size << " seq " << st.seq << " positions " << start << "+" << st.n;
    EXPECT_EQ(0, std::memcmp(od.captured.data(), op.captured.data(), od.captured.size() * sizeof(float)));
    EXPECT_EQ(paged->length(st.seq), start + st.n);
    len[static_cast<size_t>(st.seq)] = start + st.n - st.rollback;
    dense->truncate(st.seq, len[static_cast<size_t>(st.seq)]);
  }
}

void run_shapes(const TinySpec& s) {
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  const std::vector<std::vector<int32_t>> seqs = {make_tokens(60, s.vocab, 1), make_tokens(60, s.vocab, 2),
                                                  make_tokens(60, s.vocab, 3)};
  const std::vector<Step> plan = {{0, 13, 0}, {1, 1, 0}, {2, 20, 0}, {1, 7, 0},  {0, 1, 0}, {0, 5, 3},
                                  {2, 4, 2},  {0, 6, 0}, {1, 17, 5}, {2, 1, 0}, {0, 9, 0}, {1, 3, 0}};
  uint32_t seed = 7;
  for (int bs : {1, 3, 4, 16, 64}) expect_paged_equals_dense(*model, bs, seqs, plan, seed++);
}

}  // namespace

TEST(PagedKV, ForwardBitIdenticalToDense) {
  TinySpec s;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.inter = 96;
  s.layers = 2;
  s.vocab = 131;
  run_shapes(s);
  s.head_dim = 8;  // the AVX2 grouped path on AVX-512 machines
  s.heads = 6;
  run_shapes(s);
}

TEST(PagedKV, CopiedBlockServesASharedPrefix) {
  TinySpec s;
  s.head_dim = 16;
  s.hidden = 64;
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  const int B = 4;
  // Sequence A: 10 tokens in blocks {5, 2, 7}. B shares A's first 6 tokens: block 5 whole,
  // then a copy of block 2's first 2 tokens into block 0, then its own block 3.
  std::vector<int32_t> a = make_tokens(10, s.vocab, 11), bt = a;
  bt.resize(6);
  for (int32_t t : make_tokens(5, s.vocab, 12)) bt.push_back(t);
  auto paged = make_paged(*model, B, 8, 2, 32);
  ForwardBatch fb;
  fb.entries.push_back({0, a, {}});
  ForwardOutput out;
  const std::vector<int32_t> ta = {5, 2, 7};
  paged->bind(0, ta, 0);
  model->forward(*paged, fb, out);
  paged->copy_block(2, 0, 2);
  const std::vector<int32_t> tb = {5, 0, 3};
  paged->bind(1, tb, 6);
  fb.entries = {{1, std::vector<int32_t>(bt.begin() + 6, bt.end()), {0, 1, 2, 3, 4}}};
  model->forward(*paged, fb, out);
  auto dense = model->make_kv_cache(1, 32);
  ForwardOutput ref;
  fb.entries = {{0, bt, {6, 7, 8, 9, 10}}};
  model->forward(*dense, fb, ref);
  ASSERT_EQ(out.logits.size(), ref.logits.size());
  EXPECT_EQ(0, std::memcmp(out.logits.data(), ref.logits.data(), ref.logits.size() * sizeof(float)));
}

TEST(PagedKV, BadTablesAreErrors) {
  TinySpec s;
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  auto paged = make_paged(*model, 4, 6, 2, 16);
  const std::vector<int32_t> bad = {1, 6};
  EXPECT_THROW(paged->bind(0, bad, 0), Error);
  const std::vector<int32_t> one = {1};
  EXPECT_THROW(paged->bind(0, one, 5), Error);  // 5 positions in one 4-token block
  EXPECT_THROW(paged->bind(2, one, 0), Error);
  EXPECT_THROW(paged->copy_block(0, 6, 1), Error);
  EXPECT_THROW(PagedKVCache(1, 1, 8, 0, 4, 1, 8), Error);
  paged->bind(0, one, 2);
  ForwardBatch b;
  b.entries.push_back({0, {1, 2, 3}, {}});  // positions 2..4: the table holds 0..3
  ForwardOutput out;
  try {
    model->forward(*paged, b, out);
    ADD_FAILURE() << "overflow accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache overflow"), std::string::npos) << e.what();
  }
  EXPECT_EQ(paged->length(0), 2);
}

namespace {

// Sets the process-wide matmul precision for one test and restores it after.
struct PrecisionScope {
  explicit PrecisionScope(MatmulPrecision p) : saved(matmul_precision()) { set_matmul_precision(p); }
  ~PrecisionScope() { set_matmul_precision(saved); }
  MatmulPrecision saved;
};

TinySpec bf16_spec(int head_dim) {
  TinySpec s;
  s.hidden = 96;
  s.heads = 6;
  s.kv_heads = 2;
  s.head_dim = head_dim;
  s.inter = 128;
  s.layers = 2;
  s.vocab = 131;
  s.dtype = DType::BF16;
  return s;
}

}  // namespace

TEST(PagedKV, Bf16PrecisionKeepsBf16KvAndPagedEqualsDense) {
  PrecisionScope prec(MatmulPrecision::Bf16Dot);
  for (int D : {64, 16}) {
    const TinySpec s = bf16_spec(D);
    TempDir dir;
    write_tiny_model(dir.path, s);
    auto model = load_model(dir.path);
    ASSERT_EQ(model->kv_dtype(), DType::BF16);
    auto kv = model->make_kv_cache(1, 8);
    EXPECT_EQ(dynamic_cast<DenseKVCache&>(*kv).dtype(), DType::BF16);
    EXPECT_THROW(dynamic_cast<DenseKVCache&>(*kv).k(0, 0), Error);  // F32 view of a BF16 cache
    const std::vector<std::vector<int32_t>> seqs = {make_tokens(60, s.vocab, 1), make_tokens(60, s.vocab, 2),
                                                    make_tokens(60, s.vocab, 3)};
    const std::vector<Step> plan = {{0, 13, 0}, {1, 1, 0}, {2, 20, 0}, {1, 7, 0}, {0, 1, 0}, {0, 5, 3},
                                    {2, 4, 2},  {0, 6, 0}, {1, 17, 5}, {2, 1, 0}, {0, 9, 0}};
    uint32_t seed = 11;
    for (int bs : {1, 16, 64}) expect_paged_equals_dense(*model, bs, seqs, plan, seed++);
  }
}

TEST(PagedKV, F32PrecisionOrF32WeightsKeepF32Kv) {
  TempDir dir;
  write_tiny_model(dir.path, bf16_spec(64));
  auto model = load_model(dir.path);
  {
    PrecisionScope prec(MatmulPrecision::F32);
    EXPECT_EQ(model->kv_dtype(), DType::F32);
  }
  TinySpec f = bf16_spec(64);
  f.dtype = DType::F32;
  TempDir dir32;
  write_tiny_model(dir32.path, f);
  auto model32 = load_model(dir32.path);
  PrecisionScope prec(MatmulPrecision::Bf16Dot);
  EXPECT_EQ(model32->kv_dtype(), DType::F32);
}

// A token's logits in bf16 precision are the same whether its sequence runs alone or in a
// batch with other sequences (dense cache, several slots, one forward).
TEST(PagedKV, Bf16KvLogitsDoNotDependOnTheBatch) {
  PrecisionScope prec(MatmulPrecision::Bf16Dot);
  TempDir dir;
  const TinySpec s = bf16_spec(64);
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  const auto a = make_tokens(40, s.vocab, 5), b = make_tokens(25, s.vocab, 6);
  // Alone: a's 40 tokens as a 34-token prefill then a 6-token verify block.
  auto alone = model->make_kv_cache(1, 64);
  ForwardBatch fb;
  fb.entries.resize(1);
  fb.entries[0].slot = 0;
  fb.entries[0].tokens.assign(a.begin(), a.begin() + 34);
  ForwardOutput out;
  model->forward(*alone, fb, out);
  fb.entries[0].tokens.assign(a.begin() + 34, a.end());
  fb.entries[0].logit_rows = {0, 1, 2, 3, 4, 5};
  ForwardOutput ref;
  model->forward(*alone, fb, ref);
  // Batched: b's prefill shares the forward of a's prefill, and b's decode shares a's verify.
  auto both = model->make_kv_cache(2, 64);
  ForwardBatch fb2;
  fb2.entries.resize(2);
  fb2.entries[0].slot = 1;
  fb2.entries[0].tokens.assign(b.begin(), b.begin() + 24);
  fb2.entries[1].slot = 0;
  fb2.entries[1].tokens.assign(a.begin(), a.begin() + 34);
  model->forward(*both, fb2, out);
  fb2.entries[0].tokens = {b[24]};
  fb2.entries[0].logit_rows = {0};
  fb2.entries[1].tokens.assign(a.begin() + 34, a.end());
  fb2.entries[1].logit_rows = {0, 1, 2, 3, 4, 5};
  model->forward(*both, fb2, out);
  const size_t V = static_cast<size_t>(out.vocab_size);
  ASSERT_EQ(out.logits.size(), 7 * V);
  EXPECT_EQ(0, std::memcmp(out.logits.data() + V, ref.logits.data(), 6 * V * sizeof(float)));
}

TEST(PagedKV, Bf16CopyBlockMovesEveryLayer) {
  PagedKVCache c(2, 2, 4, 4, 3, 1, 12, DType::BF16);
  EXPECT_EQ(c.dtype(), DType::BF16);
  EXPECT_THROW(c.k(0), Error);
  for (int l = 0; l < 2; ++l)
    for (int64_t i = 0; i < c.block_stride(); ++i) {
      c.k_bf16(l)[1 * c.block_stride() + i] = static_cast<uint16_t>(1000 * l + i);
      c.v_bf16(l)[1 * c.block_stride() + i] = static_cast<uint16_t>(2000 + 1000 * l + i);
      c.k_bf16(l)[2 * c.block_stride() + i] = c.v_bf16(l)[2 * c.block_stride() + i] = 7;
    }
  c.copy_block(1, 2, 3);  // positions 0..2 of each head; position 3 stays
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 2; ++g)
      for (int p = 0; p < 4; ++p)
        for (int d = 0; d < 4; ++d) {
          const int64_t i = g * c.head_stride() + p * 4 + d;
          const uint16_t wk = p < 3 ? static_cast<uint16_t>(1000 * l + i) : 7;
          const uint16_t wv = p < 3 ? static_cast<uint16_t>(2000 + 1000 * l + i) : 7;
          EXPECT_EQ(c.k_bf16(l)[2 * c.block_stride() + i], wk);
          EXPECT_EQ(c.v_bf16(l)[2 * c.block_stride() + i], wv);
        }
  EXPECT_THROW(PagedKVCache(1, 1, 8, 4, 4, 1, 8, DType::F16), Error);
}
