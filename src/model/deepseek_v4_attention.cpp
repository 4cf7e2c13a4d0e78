// dsinfer model floor: DeepSeek-V4 attention, compressors and lightning indexer (see
// deepseek_v4_attention.h). The rules are transformers 5.17 modeling_deepseek_v4.py:
// DeepseekV4Attention, DeepseekV4{HCA,CSA}Compressor, DeepseekV4Indexer and
// eager_attention_forward (spec §3.4–§3.7, state rules §4).
#include "model/deepseek_v4_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace dsinfer {

namespace {

// cos/sin of one position for r/2 pairs (angles formed in F32 as transformers does).
void rope_cs(const std::vector<float>& inv, int32_t pos, float* cs, float* sn) {
  rope_tables(inv.data(), static_cast<int>(inv.size()), &pos, 1, 1.0f, cs, sn);
}

// Interleaved rotation of the last 2·half dims of x (length dim): pairs (2j, 2j+1).
// sign = +1 rotates by +θ, −1 by −θ (the output de-rotation).
void rope_tail(float* x, int dim, int half, const float* cs, const float* sn, float sign) {
  float* t = x + dim - 2 * half;
  for (int j = 0; j < half; ++j) {
    const float a = t[2 * j], b = t[2 * j + 1], c = cs[j], s = sign * sn[j];
    t[2 * j] = a * c - b * s;
    t[2 * j + 1] = b * c + a * s;
  }
}

// y = x / sqrt(mean(x²) + eps) (· w when given), one vector.
void rms_vec(const float* x, int n, const float* w, float eps, float* y) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) y[i] = w ? w[i] * (x[i] * inv) : x[i] * inv;
}

// A block of rows [r0, r0 + n) of a linear layer, as its own view.
V4Linear row_block(const V4Linear& w, int64_t r0, int64_t n) {
  V4Linear b = w;
  if (!w.quantized) {
    b.plain.data = static_cast<const uint8_t*>(w.plain.data) + r0 * w.plain.cols * dtype_size(w.plain.dtype);
    b.plain.rows = n;
    return b;
  }
  const QuantWeightView& q = w.quant;
  if (q.format == QuantFormat::Fp8Block128) {
    if (r0 % 128 != 0 || (n % 128 != 0 && r0 + n != q.rows))
      throw Error("DeepSeek-V4: grouped output projection rows are not aligned to the FP8 128-row scale blocks");
    b.quant.data = q.data + r0 * q.cols;
    b.quant.scales = q.scales + (r0 / 128) * ((q.cols + 127) / 128);
  } else {
    b.quant.data = q.data + r0 * (q.cols / 2);
    b.quant.scales = q.scales + r0 * (q.cols / 32);
  }
  b.quant.rows = n;
  return b;
}

// Pools window w of one compressor from its raw rows (C | Z per position) into `entry`
// (width X.dim): softmax over slots per channel in F32, weighted sum, rmsw, RoPE at w·m.
void pool_window(const V4Compressor& X, const V4State::PositionRows& raw, int w, float eps,
                 const std::vector<float>& inv, std::vector<float>& tmp, float* entry) {
  const int m = X.rate, dd = X.dim;
  const int cw = X.overlap ? 2 * dd : dd;   // projection width per token
  const int nslot = X.overlap ? 2 * m : m;
  tmp.resize(static_cast<size_t>(nslot) * 2 * dd);
  float* kv = tmp.data();
  float* gt = kv + nslot * dd;
  int used = 0;
  auto put = [&](int64_t pos, int j, int half_off) {
    const float* r = raw.row(static_cast<int>(pos));  // raw row: C (cw) then Z (cw)
    for (int k = 0; k < dd; ++k) {
      kv[used * dd + k] = r[half_off + k];
      gt[used * dd + k] = r[cw + half_off + k] + X.pos_bias[static_cast<size_t>(j) * cw + half_off + k];
    }
    ++used;
  };
  if (X.overlap) {
    if (w > 0)
      for (int j = 0; j < m; ++j) put(static_cast<int64_t>(w - 1) * m + j, j, 0);  // Ca of window w−1
    for (int j = 0; j < m; ++j) put(static_cast<int64_t>(w) * m + j, j, dd);       // Cb of window w
  } else {
    for (int j = 0; j < m; ++j) put(static_cast<int64_t>(w) * m + j, j, 0);
  }
  std::vector<float> pooled(dd);
  for (int k = 0; k < dd; ++k) {
    float mx = -INFINITY;
    for (int s = 0; s < used; ++s) mx = std::fmax(mx, gt[s * dd + k]);
    float sum = 0;
    for (int s = 0; s < used; ++s) sum += std::exp(gt[s * dd + k] - mx);
    float acc = 0;
    for (int s = 0; s < used; ++s) acc += kv[s * dd + k] * (std::exp(gt[s * dd + k] - mx) / sum);
    pooled[k] = acc;
  }
  rms_vec(pooled.data(), dd, X.norm.data(), eps, entry);
  const int half = static_cast<int>(inv.size());
  std::vector<float> cs(half), sn(half);
  rope_cs(inv, w * m, cs.data(), sn.data());
  rope_tail(entry, dd, half, cs.data(), sn.data(), 1.0f);
}

// Projects the compressor's raw rows for the batch, stores them per position and pools the
// windows that close in this call.
void run_compressor(const V4Compressor& X, const float* h, int64_t T, const std::vector<V4Segment>& segs, float eps,
                    const std::vector<float>& inv, V4State& st, int layer, bool indexer) {
  const int dd = X.dim, m = X.rate;
  const int cw = X.overlap ? 2 * dd : dd;
  std::vector<float> C(static_cast<size_t>(T * cw)), Z(static_cast<size_t>(T * cw)), tmp;
  v4_matmul(h, T, X.kv, C.data());
  v4_matmul(h, T, X.gate, Z.data());
  for (const V4Segment& s : segs) {
    V4State::LayerSlot& ls = st.at(layer, s.slot);
    V4State::PositionRows& raw = indexer ? ls.idx_raw : ls.comp_raw;
    std::vector<float>& ent = indexer ? ls.idx_entry : ls.comp_entry;
    const int end = s.start + s.n;
    raw.ensure(end, 2 * cw);
    for (int i = 0; i < s.n; ++i) {
      float* r = raw.row(s.start + i);
      std::memcpy(r, C.data() + (s.row0 + i) * cw, sizeof(float) * cw);
      std::memcpy(r + cw, Z.data() + (s.row0 + i) * cw, sizeof(float) * cw);
    }
    const int w0 = s.start / m, w1 = end / m;
    if (ent.size() < static_cast<size_t>(w1) * dd) ent.resize(static_cast<size_t>(w1) * dd);
    for (int w = w0; w < w1; ++w) pool_window(X, raw, w, eps, inv, tmp, ent.data() + static_cast<int64_t>(w) * dd);
  }
}

}  // namespace

void v4_rope_rows(const std::vector<float>& inv, const int32_t* pos, int64_t T, float* cs, float* sn) {
  rope_tables(inv.data(), static_cast<int>(inv.size()), pos, T, 1.0f, cs, sn);
}

void v4_attn_kv(const V4LayerWeights& L, const DeepseekV4Config& c, int half, const float* cs, const float* sn,
                const float* x, int64_t T, float* kv) {
  const int d = c.head_dim;
  v4_matmul(x, T, L.kv, kv);
  rmsnorm(kv, d, T, d, L.kv_norm.data(), static_cast<float>(c.eps), kv, d);
  for (int64_t r = 0; r < T; ++r) rope_tail(kv + r * d, d, half, cs + r * half, sn + r * half, 1.0f);
}

void v4_attn_project(const V4LayerWeights& L, const DeepseekV4Config& c, int half, const float* cs, const float* sn,
                     const float* h, int64_t T, float* qres, float* q, float* kv) {
  const int H = c.heads, d = c.head_dim, qr = c.q_lora;
  const int64_t Hd = static_cast<int64_t>(H) * d;
  const float eps = static_cast<float>(c.eps);
  v4_matmul(h, T, L.q_a, qres);
  rmsnorm(qres, qr, T, qr, L.q_a_norm.data(), eps, qres, qr);
  v4_matmul(qres, T, L.q_b, q);
  for (int64_t r = 0; r < T; ++r)
    for (int hh = 0; hh < H; ++hh) {
      float* qh = q + r * Hd + static_cast<int64_t>(hh) * d;
      rms_vec(qh, d, nullptr, eps, qh);
      rope_tail(qh, d, half, cs + r * half, sn + r * half, 1.0f);
    }
  v4_attn_kv(L, c, half, cs, sn, h, T, kv);
}

// a·b over n floats in a fixed order: eight running sums (element k goes to sum k % 8), then
// ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)). Eight independent chains instead of one
// (the compiler vectorizes them without reordering anything), and the same bits for a row
// whatever shares its batch.
static float dot8(const float* a, const float* b, int n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int k = 0;
  for (; k + 8 <= n; k += 8)
    for (int i = 0; i < 8; ++i) s[i] += a[k + i] * b[k + i];
  for (int i = 0; k < n; ++k, ++i) s[i] += a[k] * b[k];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

void v4_attn_row(const V4LayerWeights& L, const DeepseekV4Config& c, const float* q_row, const float* const* keys,
                 size_t nk, const float* cs, const float* sn, int half, std::vector<float>& logit, float* o_row) {
  const int H = c.heads, d = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  logit.resize(nk);
  for (int hh = 0; hh < H; ++hh) {
    const float* qh = q_row + static_cast<int64_t>(hh) * d;
    float mx = L.sinks[hh];
    for (size_t j = 0; j < nk; ++j) {
      logit[j] = dot8(qh, keys[j], d) * scale;
      mx = std::fmax(mx, logit[j]);
    }
    float sum = std::exp(L.sinks[hh] - mx);
    for (size_t j = 0; j < nk; ++j) sum += (logit[j] = std::exp(logit[j] - mx));
    float* o = o_row + static_cast<int64_t>(hh) * d;
    std::fill(o, o + d, 0.0f);
    for (size_t j = 0; j < nk; ++j) {
      const float pj = logit[j] / sum;
      for (int k = 0; k < d; ++k) o[k] += pj * keys[j][k];
    }
    rope_tail(o, d, half, cs, sn, -1.0f);
  }
}

void v4_attn_output(const V4LayerWeights& L, const DeepseekV4Config& c, const float* att, int64_t T, float* out) {
  const int G = c.o_groups, orank = c.o_lora;
  const int64_t Hd = static_cast<int64_t>(c.heads) * c.head_dim;
  // Grouped output projection: group g = heads [g·H/G, (g+1)·H/G) → o_r, then W_ob.
  const int64_t gin = Hd / G;
  std::vector<float> xg(static_cast<size_t>(T * gin)), yg(static_cast<size_t>(T * orank)),
      cat(static_cast<size_t>(T * G * orank));
  for (int g = 0; g < G; ++g) {
    for (int64_t r = 0; r < T; ++r) std::memcpy(xg.data() + r * gin, att + r * Hd + g * gin, sizeof(float) * gin);
    const V4Linear blk = row_block(L.o_a, static_cast<int64_t>(g) * orank, orank);
    v4_matmul(xg.data(), T, blk, yg.data());
    for (int64_t r = 0; r < T; ++r)
      std::memcpy(cat.data() + r * G * orank + static_cast<int64_t>(g) * orank, yg.data() + r * orank, sizeof(float) * orank);
  }
  v4_matmul(cat.data(), T, L.o_b, out);
}

void v4_attention(const V4LayerWeights& L, const DeepseekV4Config& c, const V4RopeTables& rope, int layer,
                  V4State& st, const std::vector<V4Segment>& segs, const float* h, int64_t T, float* out) {
  const int H = c.heads, d = c.head_dim, qr = c.q_lora, W = c.window;
  const int64_t Hd = static_cast<int64_t>(H) * d;
  const float eps = static_cast<float>(c.eps);
  const bool sliding = L.attn == V4Attn::Sliding, csa = L.attn == V4Attn::CSA;
  const std::vector<float>& inv = sliding ? rope.main_inv : rope.compress_inv;
  const int half = static_cast<int>(inv.size());

  // Positions and RoPE tables of the rows.
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (const V4Segment& s : segs)
    for (int i = 0; i < s.n; ++i) pos[s.row0 + i] = s.start + i;
  std::vector<float> cs(static_cast<size_t>(T * half)), sn(static_cast<size_t>(T * half));
  v4_rope_rows(inv, pos.data(), T, cs.data(), sn.data());

  // Queries and the shared K=V row.
  std::vector<float> qres(static_cast<size_t>(T * qr)), q(static_cast<size_t>(T * Hd)), kv(static_cast<size_t>(T * d));
  v4_attn_project(L, c, half, cs.data(), sn.data(), h, T, qres.data(), q.data(), kv.data());
  for (const V4Segment& s : segs) {
    V4State::PositionRows& rows = st.at(layer, s.slot).kv;
    rows.ensure(s.start + s.n, d);
    std::memcpy(rows.row(s.start), kv.data() + s.row0 * d, sizeof(float) * s.n * d);
  }

  // Compressed branches.
  std::vector<float> iq, iw;
  const int HI = c.idx_heads, dI = c.idx_head_dim;
  if (!sliding) {
    run_compressor(L.comp, h, T, segs, eps, rope.compress_inv, st, layer, false);
    if (csa) {
      run_compressor(L.idx, h, T, segs, eps, rope.compress_inv, st, layer, true);
      iq.resize(static_cast<size_t>(T * HI * dI));
      iw.resize(static_cast<size_t>(T * HI));
      v4_matmul(qres.data(), T, L.idx_q_b, iq.data());
      v4_matmul(h, T, L.idx_weights, iw.data());
      const float wscale = 1.0f / std::sqrt(static_cast<float>(HI));
      for (int64_t r = 0; r < T; ++r) {
        for (int hh = 0; hh < HI; ++hh)
          rope_tail(iq.data() + (r * HI + hh) * dI, dI, half, cs.data() + r * half, sn.data() + r * half, 1.0f);
        for (int hh = 0; hh < HI; ++hh) iw[r * HI + hh] *= wscale;
      }
    }
  }

  // Core attention, row by row (independent rows: threads split rows, never a row).
  std::vector<float> att(static_cast<size_t>(T * Hd));
  std::vector<int> row_seg(static_cast<size_t>(T));
  for (size_t si = 0; si < segs.size(); ++si)
    for (int i = 0; i < segs[si].n; ++i) row_seg[segs[si].row0 + i] = static_cast<int>(si);
  const float iscale = 1.0f / std::sqrt(static_cast<float>(dI));
  const int m = sliding ? 0 : L.comp.rate;
  ThreadPool::global().parallel_for(static_cast<size_t>(T), [&](size_t lo, size_t hi) {
    std::vector<const float*> keys;
    std::vector<float> logit, score;
    std::vector<int> order;
    for (size_t rr = lo; rr < hi; ++rr) {
      const int64_t r = static_cast<int64_t>(rr);
      const V4Segment& s = segs[row_seg[r]];
      V4State::LayerSlot& ls = st.at(layer, s.slot);
      const int p = pos[r];
      keys.clear();
      for (int t = std::max(0, p - W + 1); t <= p; ++t) keys.push_back(ls.kv.row(t));
      if (!sliding) {
        const int nvis = (p + 1) / m;
        if (!csa) {
          for (int w = 0; w < nvis; ++w) keys.push_back(ls.comp_entry.data() + static_cast<int64_t>(w) * d);
        } else if (nvis > 0) {
          score.assign(nvis, 0.0f);
          const float* qi = iq.data() + r * HI * dI;
          for (int w = 0; w < nvis; ++w) {
            const float* kw = ls.idx_entry.data() + static_cast<int64_t>(w) * dI;
            float sc = 0;
            for (int hh = 0; hh < HI; ++hh) {
              const float dot = dot8(qi + hh * dI, kw, dI);
              sc += std::fmax(dot, 0.0f) * iscale * iw[r * HI + hh];
            }
            score[w] = sc;
          }
          const int kk = std::min(c.idx_topk, nvis);
          order.resize(nvis);
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + kk, order.end(), [&](int a, int b) {
            return score[a] > score[b] || (score[a] == score[b] && a < b);
          });
          std::sort(order.begin(), order.begin() + kk);
          for (int j = 0; j < kk; ++j) keys.push_back(ls.comp_entry.data() + static_cast<int64_t>(order[j]) * d);
        }
      }
      v4_attn_row(L, c, q.data() + r * Hd, keys.data(), keys.size(), cs.data() + r * half, sn.data() + r * half, half,
                  logit, att.data() + r * Hd);
    }
  });

  v4_attn_output(L, c, att.data(), T, out);
}

}  // namespace dsinfer
