// dsinfer tests: attention over a paged K/V cache (AttentionBlock::block_ids) gives the same
// bits as over the same K/V stored densely, for every ISA path this CPU can run.
//
// Each case scatters a dense cache ([n_kv][keys][D]) into blocks of page_size tokens
// ([block][n_kv][page_size][D], block ids shuffled, unused blocks filled with NaN so a
// wrong address shows), runs attention_isa on both layouts and memcmp's every output.
// Page sizes 1, 3, 8, 16, 17 and 64 put block edges inside and across the kernels' 8-key
// score tiles and 16-key-aligned key blocks; head_dim 64 (grouped AVX-512/AVX2), 24
// (grouped AVX2, AVX-512 falls back to it) and 20 (the per-row fallback, which gathers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/cpu_features.h"

namespace dsinfer {
namespace {

using attention_detail::attention_isa;
using attention_detail::hardware_isa_level;

struct PagedCase {
  int head_dim, group, n_kv, n_q, start, page;
  bool causal;
};

// Returns the number of output floats that differ between the dense and the paged run.
int64_t compare(IsaLevel isa, const PagedCase& c, ThreadPool& pool, uint32_t seed) {
  const int D = c.head_dim, H = c.group * c.n_kv, keys = c.start + c.n_q, P = c.page;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uk(-1.0f, 1.0f), uq(-3.0f, 3.0f);
  std::vector<float> k(static_cast<size_t>(c.n_kv) * keys * D), v(k.size()), q(static_cast<size_t>(c.n_q) * H * D);
  for (auto& x : k) x = uk(rng);
  for (auto& x : v) x = uk(rng);
  for (auto& x : q) x = uq(rng);

  const int n_pages = (keys + P - 1) / P, n_blocks = n_pages + 3;  // a few blocks nobody uses
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<size_t>(n_pages));
  const int64_t block_stride = int64_t{c.n_kv} * P * D;
  std::vector<float> pk(static_cast<size_t>(n_blocks * block_stride), std::nanf("")), pv(pk);
  for (int g = 0; g < c.n_kv; ++g)
    for (int p = 0; p < keys; ++p) {
      const int64_t dst = ids[static_cast<size_t>(p / P)] * block_stride + int64_t{g} * P * D + int64_t{p % P} * D;
      std::memcpy(&pk[static_cast<size_t>(dst)], &k[(static_cast<size_t>(g) * keys + p) * D], D * sizeof(float));
      std::memcpy(&pv[static_cast<size_t>(dst)], &v[(static_cast<size_t>(g) * keys + p) * D], D * sizeof(float));
    }

  std::vector<float> out_dense(q.size(), 1.0f), out_paged(q.size(), 2.0f);
  AttentionBlock b;
  b.q = q.data();
  b.q_stride = int64_t{H} * D;
  b.n_q = c.n_q;
  b.start_pos = c.start;
  b.causal = c.causal;
  b.k = k.data();
  b.v = v.data();
  b.kv_head_stride = int64_t{keys} * D;
  b.out = out_dense.data();
  b.out_stride = int64_t{H} * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  attention_isa(isa, &b, 1, H, c.n_kv, D, scale, &pool);
  b.k = pk.data();
  b.v = pv.data();
  b.kv_head_stride = int64_t{P} * D;
  b.block_ids = ids.data();
  b.block_stride = block_stride;
  b.page_size = P;
  b.out = out_paged.data();
  attention_isa(isa, &b, 1, H, c.n_kv, D, scale, &pool);
  int64_t bad = 0;
  for (size_t i = 0; i < q.size(); ++i) bad += std::memcmp(&out_dense[i], &out_paged[i], sizeof(float)) != 0;
  return bad;
}

TEST(AttentionPaged, BitIdenticalToDenseOnEveryPath) {
  std::vector<IsaLevel> isas{IsaLevel::Scalar};
  if (hardware_isa_level() >= IsaLevel::Avx2) isas.push_back(IsaLevel::Avx2);
  if (hardware_isa_level() >= IsaLevel::Avx512) isas.push_back(IsaLevel::Avx512);
  ThreadPool pool(2);
  uint32_t seed = 1;
  int cases = 0;
  for (IsaLevel isa : isas)
    for (int D : {64, 24, 20})
      for (int page : {1, 3, 8, 16, 17, 64})
        for (const PagedCase& base : {PagedCase{0, 3, 2, 1, 0, 0, true}, PagedCase{0, 3, 2, 1, 130, 0, true},
                                      PagedCase{0, 1, 1, 7, 45, 0, true}, PagedCase{0, 4, 2, 40, 0, 0, true},
                                      PagedCase{0, 2, 2, 5, 200, 0, false}}) {
          PagedCase c = base;
          c.head_dim = D;
          c.page = page;
          const int64_t bad = compare(isa, c, pool, seed++);
          EXPECT_EQ(bad, 0) << isa_level_name(isa) << " D=" << D << " page=" << page << " n_q=" << c.n_q
                            << " start=" << c.start << (c.causal ? " causal" : " non-causal");
          ++cases;
        }
  EXPECT_GT(cases, 0);
}

}  // namespace
}  // namespace dsinfer
