// Model floor: Qwen3 forward correctness and the determinism contract.
//  - logits and captured layer outputs against an independent double-precision reference
//    (model_test_util.h) on tiny random checkpoints of several shapes;
//  - batch invariance: a token's logits and captured hidden states are bit-identical
//    whether computed alone, in a prefill, decoded one by one, in chunks, next to other
//    sequences, or with 1/2/3 threads;
//  - KV truncation (speculation rollback) followed by re-feeding equals a fresh prefill;
//  - embed()/lm_head() agree with forward(); bad input throws before the cache changes.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
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

std::vector<int> all_rows(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

// |a - b| <= tol * max(1, max |ref| over the row).
void expect_close_rows(const float* got, const std::vector<double>& ref, double tol, const std::string& what) {
  double scale = 1.0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double d = std::abs(got[i] - ref[i]);
    if (d > worst) worst = d, at = i;
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst |diff| " << worst << " at " << at << " (got " << got[at]
                                << ", ref " << ref[at] << ", row scale " << scale << ")";
}

struct Case {
  std::string name;
  TinySpec spec;
};

std::vector<Case> reference_cases() {
  std::vector<Case> c;
  TinySpec s;
  c.push_back({"untied_gqa2", s});
  s = {};
  s.tied = true;
  s.kv_heads = 4;  // GQA ratio 1 (MHA)
  s.bias = true;
  s.seed = 2;
  c.push_back({"tied_mha_bias", s});
  s = {};
  s.heads = 8;
  s.kv_heads = 2;  // GQA ratio 4
  s.head_dim = 12;  // head_dim != hidden / heads
  s.hidden = 40;
  s.seed = 3;
  c.push_back({"gqa4_hd12", s});
  s = {};
  s.rope_type = "yarn";
  s.heads = 6;
  s.kv_heads = 2;
  s.hidden = 48;
  s.theta = 50000;
  s.seed = 4;
  c.push_back({"yarn_gqa3", s});
  s = {};
  s.rope_type = "linear";
  s.factor = 2.0;
  s.seed = 5;
  c.push_back({"linear", s});
  s = {};
  s.dtype = DType::BF16;
  s.kv_heads = 1;
  s.seed = 6;
  c.push_back({"bf16_mqa", s});
  s = {};
  s.dtype = DType::F16;
  s.layers = 3;
  s.seed = 7;
  c.push_back({"f16_converted", s});
  return c;
}

}  // namespace

TEST(ModelForward, MatchesDoubleReference) {
  for (const Case& c : reference_cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    WeightMap w = write_tiny_model(dir.path, c.spec);
    auto model = load_model(dir.path);
    const int n = 19;
    auto toks = make_tokens(n, c.spec.vocab, 100 + c.spec.seed);
    RefOutput ref = reference_forward(c.spec, w, toks);
    auto kv = model->make_kv_cache(1, 64);
    ForwardBatch b;
    b.entries.push_back({0, toks, all_rows(n)});
    for (int l = -1; l < c.spec.layers; ++l) b.capture_layers.push_back(l);
    ForwardOutput out;
    model->forward(*kv, b, out);
    ASSERT_EQ(out.logits.size(), size_t(n) * c.spec.vocab);
    const int H = c.spec.hidden, ncap = c.spec.layers + 1;
    ASSERT_EQ(out.captured.size(), size_t(n) * ncap * H);
    for (int t = 0; t < n; ++t) {
      expect_close_rows(out.logits.data() + size_t(t) * c.spec.vocab, ref.logits[t], 1e-4, "logits pos " + std::to_string(t));
      for (int ci = 0; ci < ncap; ++ci)
        expect_close_rows(out.captured.data() + (size_t(t) * ncap + ci) * H, ref.hidden[ci][t], 1e-4,
                          "captured layer " + std::to_string(ci - 1) + " pos " + std::to_string(t));
    }
    EXPECT_EQ(kv->length(0), n);
  }
}

namespace {

// Per-token results of sequence A, in position order: logits row and captured row.
struct TokenResults {
  std::vector<std::vector<float>> logits, captured;
};

constexpr int kSeqA = 0;

// Runs `plan`: a list of forward calls; each call is a list of (sequence, token count)
// pieces, sequences advancing through their own token lists. Collects every result of A.
TokenResults run_plan(Model& m, const std::vector<std::vector<int32_t>>& seqs,
                      const std::vector<std::vector<std::pair<int, int>>>& plan, const std::vector<int>& capture) {
  auto kv = m.make_kv_cache(static_cast<int>(seqs.size()), 64);
  std::vector<size_t> done(seqs.size(), 0);
  TokenResults res;
  const int V = m.config().vocab_size, H = m.config().hidden_size;
  const size_t ncap = capture.size();
  for (const auto& call : plan) {
    ForwardBatch b;
    b.capture_layers = capture;
    std::vector<int> tok_offset;
    int total = 0;
    for (auto [s, n] : call) {
      std::vector<int32_t> t(seqs[s].begin() + done[s], seqs[s].begin() + done[s] + n);
      b.entries.push_back({s, t, all_rows(n)});
      tok_offset.push_back(total);
      total += n;
    }
    ForwardOutput out;
    m.forward(*kv, b, out);
    int logit_row = 0;
    for (size_t e = 0; e < call.size(); ++e) {
      auto [s, n] = call[e];
      for (int i = 0; i < n; ++i, ++logit_row) {
        if (s != kSeqA) continue;
        res.logits.emplace_back(out.logits.begin() + size_t(logit_row) * V, out.logits.begin() + size_t(logit_row + 1) * V);
        const size_t r = tok_offset[e] + i;
        res.captured.emplace_back(out.captured.begin() + r * ncap * H, out.captured.begin() + (r + 1) * ncap * H);
      }
      done[s] += n;
    }
  }
  return res;
}

void expect_bit_identical(const TokenResults& a, const TokenResults& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t t = 0; t < a.logits.size(); ++t) {
    EXPECT_EQ(0, std::memcmp(a.logits[t].data(), b.logits[t].data(), a.logits[t].size() * 4)) << what << ": logits of token " << t;
    EXPECT_EQ(0, std::memcmp(a.captured[t].data(), b.captured[t].data(), a.captured[t].size() * 4))
        << what << ": captured hidden of token " << t;
  }
}

}  // namespace

TEST(ModelForward, BatchInvariance) {
  TinySpec s;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.inter = 96;
  s.layers = 3;
  s.vocab = 131;
  s.dtype = DType::BF16;
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  const std::vector<std::vector<int32_t>> seqs = {make_tokens(13, s.vocab, 1), make_tokens(9, s.vocab, 2),
                                                  make_tokens(21, s.vocab, 3)};
  const std::vector<int> capture = {-1, 0, 2};
  const int A = 13;

  ThreadPool::set_global_threads(1);
  const TokenResults base = run_plan(*model, seqs, {{{0, A}}}, capture);
  ASSERT_EQ(base.logits.size(), size_t(A));

  std::vector<std::vector<std::pair<int, int>>> decode;
  for (int i = 0; i < A; ++i) decode.push_back({{0, 1}});
  const std::vector<std::pair<std::string, std::vector<std::vector<std::pair<int, int>>>>> plans = {
      {"token-by-token decode", decode},
      {"chunked prefill 5+4+4", {{{0, 5}}, {{0, 4}}, {{0, 4}}}},
      {"prefill 1 then 12", {{{0, 1}}, {{0, 12}}}},
      {"batched with others (A first)", {{{0, A}, {1, 9}, {2, 21}}}},
      {"batched with others (A last)", {{{2, 21}, {1, 9}, {0, A}}}},
      {"mixed prefill/decode steps",
       {{{1, 4}, {0, 3}}, {{2, 10}, {0, 1}, {1, 5}}, {{0, 6}}, {{2, 11}, {0, 1}}, {{0, 2}}}},
  };
  for (int threads : {1, 2, 3}) {
    ThreadPool::set_global_threads(threads);
    expect_bit_identical(base, run_plan(*model, seqs, {{{0, A}}}, capture), "prefill, threads " + std::to_string(threads));
    for (const auto& [name, plan] : plans)
      expect_bit_identical(base, run_plan(*model, seqs, plan, capture), name + ", threads " + std::to_string(threads));
  }
  ThreadPool::set_global_threads(0);
}

TEST(ModelForward, TruncateAndRefeedMatchesFreshPrefill) {
  TinySpec s;
  s.layers = 2;
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  auto toks = make_tokens(12, s.vocab, 9);
  auto alt = toks;
  for (int i = 7; i < 12; ++i) alt[i] = (alt[i] + 5) % s.vocab;  // a rejected draft's tokens

  auto fresh = [&](const std::vector<int32_t>& t) {
    auto kv = model->make_kv_cache(1, 32);
    ForwardBatch b;
    b.entries.push_back({0, t, all_rows(static_cast<int>(t.size()))});
    ForwardOutput out;
    model->forward(*kv, b, out);
    return out.logits;
  };
  const auto ref = fresh(toks);

  auto kv = model->make_kv_cache(1, 32);
  ForwardOutput out;
  ForwardBatch b;
  b.entries.push_back({0, alt, all_rows(12)});  // prefill with the "draft"
  model->forward(*kv, b, out);
  kv->truncate(0, 7);
  EXPECT_EQ(kv->length(0), 7);
  b.entries[0] = {0, std::vector<int32_t>(toks.begin() + 7, toks.end()), all_rows(5)};
  model->forward(*kv, b, out);
  ASSERT_EQ(out.logits.size(), size_t(5) * s.vocab);
  EXPECT_EQ(0, std::memcmp(out.logits.data(), ref.data() + size_t(7) * s.vocab, out.logits.size() * 4));
  EXPECT_EQ(kv->length(0), 12);
  EXPECT_THROW(kv->truncate(0, 13), Error);
  kv->clear(0);
  EXPECT_EQ(kv->length(0), 0);
}

TEST(ModelForward, CaptureEmbedAndLmHeadAgreeWithForward) {
  TinySpec s;
  s.tied = true;
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  const int n = 6, H = s.hidden, V = s.vocab;
  auto toks = make_tokens(n, V, 4);
  auto kv = model->make_kv_cache(2, 16);
  ForwardBatch b;
  b.entries.push_back({1, toks, {n - 1, 0}});  // rows in any order, returned in that order
  b.capture_layers = {s.layers - 1, -1};
  ForwardOutput out;
  model->forward(*kv, b, out);
  ASSERT_EQ(out.vocab_size, V);
  ASSERT_EQ(out.hidden_size, H);
  ASSERT_EQ(out.logits.size(), size_t(2) * V);
  ASSERT_EQ(out.captured.size(), size_t(n) * 2 * H);
  std::vector<float> emb(size_t(n) * H);
  model->embed(toks.data(), n, emb.data());
  for (int t = 0; t < n; ++t)
    EXPECT_EQ(0, std::memcmp(out.captured.data() + (size_t(t) * 2 + 1) * H, emb.data() + size_t(t) * H, H * 4)) << t;
  // lm_head(final norm(last layer output)) must give the forward's logits bit for bit.
  std::vector<float> last(size_t(2) * H), logits(size_t(2) * V);
  std::memcpy(last.data(), out.captured.data() + (size_t(n - 1) * 2) * H, H * 4);
  std::memcpy(last.data() + H, out.captured.data() + 0, H * 4);
  model->lm_head(last.data(), 2, logits.data(), true);
  EXPECT_EQ(0, std::memcmp(logits.data(), out.logits.data(), logits.size() * 4));
  EXPECT_GT(model->decode_weight_bytes(), 0u);
}

TEST(ModelForward, BadInputThrowsBeforeTouchingTheCache) {
  TinySpec s;
  TempDir dir;
  write_tiny_model(dir.path, s);
  auto model = load_model(dir.path);
  auto kv = model->make_kv_cache(2, 8);
  ForwardOutput out;
  ForwardBatch ok;
  ok.entries.push_back({0, {1, 2, 3}, {2}});
  model->forward(*kv, ok, out);
  ASSERT_EQ(kv->length(0), 3);
  auto expect_error = [&](ForwardBatch b, const std::string& needle) {
    try {
      model->forward(*kv, b, out);
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(kv->length(0), 3);
    EXPECT_EQ(kv->length(1), 0);
  };
  ForwardBatch b;
  b.entries = {{1, {1, 2}, {}}, {0, {5, s.vocab}, {}}};
  expect_error(b, "token id 97 outside the vocabulary");
  b.entries = {{1, {1, 2}, {}}, {0, {-1}, {}}};
  expect_error(b, "token id -1");
  b.entries = {{2, {1}, {}}};
  expect_error(b, "slot out of range");
  b.entries = {{1, {1}, {}}, {0, {1, 2, 3, 4, 5, 6}, {}}};
  expect_error(b, "KV cache overflow");
  b.entries = {{1, {1}, {}}, {1, {1}, {}}};
  expect_error(b, "slot appears twice");
  b.entries = {{1, {1, 2}, {2}}};
  expect_error(b, "logit row 2");
  b.entries = {{1, {1}, {0}}};
  b.capture_layers = {s.layers};
  expect_error(b, "capture layer");
  std::vector<int32_t> bad = {s.vocab};
  std::vector<float> e(s.hidden);
  EXPECT_THROW(model->embed(bad.data(), 1, e.data()), Error);
}
