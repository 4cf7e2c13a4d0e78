// dsinfer kernels: the Bf16Dot matmul on Intel AMX tiles (compiled with the AVX-512 flags
// plus -mamx-tile -mamx-bf16; only called when amx_usable() says the CPU has AMX-BF16 and
// Linux granted this process the tile state).
//
// Why: a speculative round verifies ~9 rows. The vdpbf16ps kernel is compute-bound at that
// size on one Sapphire/Emerald Rapids core (~36 G multiply-adds/s, a third of it in the
// horizontal reduction of 16-lane partial sums, K being only 320-1280), so 9 rows cost ~6
// decodes. TDPBF16PS does up to 16x16x32 multiply-adds per instruction and accumulates
// along K in the output layout, so 9 rows cost about what one does: the weights' trip from
// cache, as speculative decoding assumes.
//
// Layout. W is re-laid out once, at model load (amx_pack_weights), into "VNNI" tiles: the
// tile of panel p (16 output features) and K chunk c holds, at pair k2 and lane j,
// (W[16p + j][32c + 2 k2], W[16p + j][32c + 2 k2 + 1]): 1 KB, one B tile. Tiles are stored
// by groups of 4 panels, chunk-major inside a group ([group][chunk][4 panels][1 KB]), so a
// block of 4 panels reads one linear stream (a tile load of 16 strided W rows ran at 2/3
// of the vdpbf16ps kernel's decode bandwidth; 4 interleaved 1 KB streams at ~0.9). x rounded to BF16 (Bf16Dot step 0) is the A tile as it is: m rows of 32 K
// elements, row stride ldx. C = m x 16 F32 accumulators, zeroed, accumulated over the K
// chunks in order, stored into y.
//
// Order of operations (measured on this hardware, 0 differences in 128K random elements;
// the SDM's pseudo-code says the same): per instruction and output element, the 16 even
// products and the 16 odd products of the chunk are each summed by a chain of fmas from
// +0 (FTZ/DAZ, RNE), then acc = acc + (even + odd). tests/unit/test_kernels_matmul_amx.cpp
// holds a scalar version of that and checks the kernel against it bit for bit. It is not
// the canonical Bf16Dot order of matmul_internal.h (so AMX bits differ from the other
// paths), but it depends only on row j of W and row i of x: the same instructions over the
// same chunks whatever m is, whichever rows share the call or the tile, however threads
// split W. That is the batch-invariance contract, tested bit for bit as for every path.
//
// Shapes: K % 32 == 0 (WeightStore packs nothing else; an unpacked matrix takes the
// vdpbf16ps kernel for every m alike). The last panel is zero-padded to 16 features.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace dsinfer::matmul_detail {
namespace {

constexpr int kPanel = 16;  // output features per panel / B tile
constexpr int kTileK = 32;  // K elements per tile step (64 bytes of BF16)
constexpr int64_t kChunkElems = kPanel * kTileK;  // BF16 elements in one B tile (1 KB)
constexpr int kGroup = 4;                         // panels stored chunk-interleaved

// Element offset of the tile (panel p, chunk c) in the packed layout, nk chunks per panel.
inline int64_t tile_offset(int64_t p, int64_t c, int64_t nk) {
  return ((p / kGroup * nk + c) * kGroup + p % kGroup) * kChunkElems;
}

// Tiles 0-3: accumulators (rows x 64 bytes); 4-5: W (16 K-pairs x 64 bytes); 6: x (rows x
// 64 bytes). `rows` = x rows of this group, 1..16. Reconfigured only when it changes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure(int rows) {
  thread_local int current = 0;
  if (current == rows) return;
  current = rows;
  TileConfig c;
  for (int t = 0; t < 7; ++t) c.colsb[t] = 64;
  for (int t : {0, 1, 2, 3, 6}) c.rows[t] = static_cast<uint8_t>(rows);
  c.rows[4] = c.rows[5] = kTileK / 2;
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the 64, so without
  // this barrier the stores above may be dropped (seen: tilezero faulting at -O2).
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

// NP consecutive panels (NP <= 4) from panel p0 of W against one group of x rows.
// out: NP blocks of [rows][16] F32, row stride ldo.
template <int NP>
void amx_panels_block(const uint16_t* x, int64_t ldx, const uint16_t* packed, int64_t p0, int64_t nk, float* out,
                      int64_t ldo) {
  _tile_zero(0);
  if constexpr (NP > 1) _tile_zero(1);
  if constexpr (NP > 2) _tile_zero(2);
  if constexpr (NP > 3) _tile_zero(3);
  for (int64_t c = 0; c < nk; ++c) {
    _tile_loadd(6, x + c * kTileK, ldx * 2);
    // W tiles alternate between 4 and 5 so a load can start while the previous product
    // still reads the other.
    _tile_loadd(4, packed + tile_offset(p0, c, nk), 64);
    _tile_dpbf16ps(0, 6, 4);
    if constexpr (NP > 1) {
      _tile_loadd(5, packed + tile_offset(p0 + 1, c, nk), 64);
      _tile_dpbf16ps(1, 6, 5);
    }
    if constexpr (NP > 2) {
      _tile_loadd(4, packed + tile_offset(p0 + 2, c, nk), 64);
      _tile_dpbf16ps(2, 6, 4);
    }
    if constexpr (NP > 3) {
      _tile_loadd(5, packed + tile_offset(p0 + 3, c, nk), 64);
      _tile_dpbf16ps(3, 6, 5);
    }
  }
  _tile_stored(0, out, ldo * 4);
  if constexpr (NP > 1) _tile_stored(1, out + kPanel, ldo * 4);
  if constexpr (NP > 2) _tile_stored(2, out + 2 * kPanel, ldo * 4);
  if constexpr (NP > 3) _tile_stored(3, out + 3 * kPanel, ldo * 4);
}

}  // namespace

bool amx_os_enabled() {
  // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux >= 5.16 hands out
  // the 8 KB tile state only on request, once per process.
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

int64_t amx_packed_elems(int64_t rows, int64_t cols) {
  // Whole groups of 4 panels (the padding is zeros, never computed past the last panel).
  const int64_t panels = (rows + kPanel - 1) / kPanel;
  return (panels + kGroup - 1) / kGroup * kGroup * kPanel * cols;
}

void amx_pack_weights(const WeightView& w, uint16_t* out) {
  const int64_t K = w.cols;
  const int64_t nk = K / kTileK;
  const int64_t panels = (w.rows + kPanel - 1) / kPanel;
  std::memset(out, 0, static_cast<size_t>(amx_packed_elems(w.rows, w.cols)) * 2);
  const char* base = static_cast<const char*>(w.data);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t c = 0; c < nk; ++c) {
      uint16_t* tile = out + tile_offset(p, c, nk);
      for (int j = 0; j < kPanel; ++j) {
        const int64_t row = p * kPanel + j;
        if (row >= w.rows) break;
        for (int k2 = 0; k2 < kTileK / 2; ++k2)  // memcpy: the mmapped W need not be aligned
          std::memcpy(tile + (k2 * kPanel + j) * 2, base + (row * K + c * kTileK + 2 * k2) * 2, 4);
      }
    }
}

void amx_rows(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
              int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t nk = K / kTileK;
  const uint16_t* packed = w.amx_panels;
  // Rows of x in groups of 16 (the last may be shorter: its own tile shape). The W range
  // [j0, j1) streams once per group; for m <= 16 (decode, verify) that is once.
  alignas(64) float tmp[16 * 4 * kPanel];
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, m - i0));
    configure(rows);
    const uint16_t* x = xb + i0 * ldx;
    float* yg = y + i0 * ldy;
    int64_t j = j0;
    // Blocks of 4 panels stored straight into y; a last block with a partial panel, or
    // fewer than 4 panels, goes through tmp.
    for (; j + 4 * kPanel <= j1; j += 4 * kPanel)
      amx_panels_block<4>(x, ldx, packed, j / kPanel, nk, yg + j, ldy);
    while (j < j1) {
      const int np = static_cast<int>(std::min<int64_t>(4, (j1 - j + kPanel - 1) / kPanel));
      const int64_t p = j / kPanel;
      switch (np) {
        case 1: amx_panels_block<1>(x, ldx, packed, p, nk, tmp, 4 * kPanel); break;
        case 2: amx_panels_block<2>(x, ldx, packed, p, nk, tmp, 4 * kPanel); break;
        case 3: amx_panels_block<3>(x, ldx, packed, p, nk, tmp, 4 * kPanel); break;
        default: amx_panels_block<4>(x, ldx, packed, p, nk, tmp, 4 * kPanel); break;
      }
      const int64_t n = std::min<int64_t>(np * kPanel, j1 - j);
      for (int r = 0; r < rows; ++r) std::memcpy(yg + r * ldy + j, tmp + r * 4 * kPanel, static_cast<size_t>(n) * 4);
      j += n;
    }
  }
}

}  // namespace dsinfer::matmul_detail
