// CUDA bodies of causal attention and RoPE (kernels/model_kernel_list.inc; the GEMMs are in
// model_gemm.cu).
//
// Attention keeps the CPU's [B H T T] probability buffer and runs per (b, h) as three kinds of
// shared-memory tiled products around a row softmax:
//   lower_products_kernel           S = X Y^T on the lower triangle    (q k^T; dA = dy v^T)
//   lower_weights_kernel            O = lower(P) Z                     (y = A v; dq = dS k)
//   lower_weights_transposed_kernel O = sum over the group's query heads of lower(P)^T Z
//                                                                      (dk = dS^T q; dv = A^T dy)
// A block of 256 threads owns a 64 x 64 output tile (4 x 4 entries a thread, 16 apart, so
// shared-memory reads are broadcasts or consecutive) and walks the inner dimension in slices of
// 16 that the block loads cooperatively, with coalesced reads, into shared memory. Tiles above
// the diagonal are never launched and slices above it never loaded; inside a loaded slice the
// entries above the diagonal, past T or past hs become 0 without being read, so any T >= 1 and
// any hs work and the upper triangle of att and datt is never touched. The softmax and its
// backward run one warp per row, the row max subtracted and subnormal tails flushed as on the
// CPU. Grouped-query heads are mapped by index (query head h reads key/value head h / group).
//
// Deterministic: each output entry is summed by one thread in a fixed order (inner index
// ascending; dk and dv over the group's query heads in head order), without atomics. The
// products use fmaf explicitly: the library's --fmad=false keeps the elementwise kernels
// bit-identical to the CPU, while the model ops are compared within 1e-5 (the CPU's model build
// may contract too), and a fused multiply-add halves the instructions and one rounding.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/model_rows.cuh"
#include "kernels/model_checks.hpp"

namespace scape::kernels::cuda {
namespace {

// AttentionShape::qkv_width, for device code.
__device__ inline int qkv_cols(const AttentionShape& s) { return (s.H + 2 * s.Hkv) * s.hs; }

// Element (b, t, column) of a [B T, width] buffer.
__device__ inline std::size_t at(int b, int t, int T, int width, int column) {
  return (static_cast<std::size_t>(b) * T + t) * width + column;
}

// ---- tiled products ------------------------------------------------------------------------

constexpr int kTile = 64;                      // output tile edge
constexpr int kSlice = 16;                     // inner-dimension entries per shared-memory slice
constexpr int kTileSide = 16;                  // threads along a tile edge
constexpr int kPerThread = kTile / kTileSide;  // each thread sums 4 x 4 entries of the tile
constexpr int kTileThreads = kTileSide * kTileSide;
// Resident blocks per SM the register budget must allow (at most 85 registers a thread): without
// it ptxas capped one kernel at 64 and spilled, or took 112 and halved the blocks per SM.
constexpr int kTileBlocksPerSm = 3;
// Blocks along y (one (b, head) each, grid-stride beyond): CUDA's limit for gridDim.y.
constexpr int kMaxGridY = 65535;

// One slice of an operand in shared memory, [inner index][tile row or column]; the padding
// column spreads the stores of load_transposed over the banks.
using Slice = float[kSlice][kTile + 1];

// A row-major matrix in global memory, entry (i, j) at data[i ld + j], seen as 0 outside
// rows x cols and, when lower, above the diagonal (j > i); entries seen as 0 are never read.
struct Matrix {
  const float* data;
  int ld, rows, cols;
  bool lower;
  __device__ float at(int i, int j) const {
    const bool inside = i < rows && j < cols && (!lower || j <= i);
    return inside ? data[static_cast<std::size_t>(i) * ld + j] : 0.0f;
  }
};

// slice[k][r] = m(row0 + r, col0 + k): rows of m become tile rows or columns. Sixteen
// neighbouring threads read 16 consecutive entries of one row.
__device__ __forceinline__ void load_transposed(Slice& slice, const Matrix& m, int row0, int col0) {
  const int k = static_cast<int>(threadIdx.x) % kSlice;
  for (int r = static_cast<int>(threadIdx.x) / kSlice; r < kTile; r += kTileThreads / kSlice) {
    slice[k][r] = m.at(row0 + r, col0 + k);
  }
}

// slice[k][c] = m(row0 + k, col0 + c): columns of m become tile columns. Neighbouring threads
// read neighbouring entries of one row.
__device__ __forceinline__ void load_direct(Slice& slice, const Matrix& m, int row0, int col0) {
  const int c = static_cast<int>(threadIdx.x) % kTile;
  for (int k = static_cast<int>(threadIdx.x) / kTile; k < kSlice; k += kTileThreads / kTile) {
    slice[k][c] = m.at(row0 + k, col0 + c);
  }
}

// The sums of one thread: tile rows ty + 16 i and columns tx + 16 j (i, j < 4).
struct TileSums {
  float v[kPerThread][kPerThread] = {};

  // v[i][j] += (sum over the slice, k ascending, of rows[k][row i] cols[k][column j]). Each
  // slice is summed on its own before it is added: a sum over T = 1024 keys then carries the
  // rounding of 16 + 64 additions in a row rather than 1024, which keeps dv and dk (long sums
  // that cancel) within 1e-5 of the exact result.
  __device__ __forceinline__ void add(const Slice& rows, const Slice& cols) {
    const int tx = static_cast<int>(threadIdx.x) % kTileSide, ty = static_cast<int>(threadIdx.x) / kTileSide;
    float part[kPerThread][kPerThread] = {};
#pragma unroll
    for (int k = 0; k < kSlice; ++k) {
      float a[kPerThread], b[kPerThread];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) a[i] = rows[k][ty + kTileSide * i];
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) b[j] = cols[k][tx + kTileSide * j];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) v[i][j] += part[i][j];
    }
  }

  // out[(row0 + r) ld + col0 + c] = the sum, for entries inside rows x cols (and on or below
  // the diagonal when lower); neighbouring threads write neighbouring columns.
  __device__ void store(float* out, int ld, int rows, int cols, bool lower, int row0, int col0) const {
    const int tx = static_cast<int>(threadIdx.x) % kTileSide, ty = static_cast<int>(threadIdx.x) / kTileSide;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int r = row0 + ty + kTileSide * i;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int c = col0 + tx + kTileSide * j;
        if (r < rows && c < cols && (!lower || c <= r)) out[static_cast<std::size_t>(r) * ld + c] = v[i][j];
      }
    }
  }
};

// Tile (row, column) of the lower triangle of a tile grid, from its index in row-major order
// over the triangle: 0 -> (0, 0), 1 -> (1, 0), 2 -> (1, 1), 3 -> (2, 0), ...
struct TilePosition {
  int row, col;
};
__device__ TilePosition lower_tile(int index) {
  int row = static_cast<int>((sqrtf(8.0f * static_cast<float>(index) + 1.0f) - 1.0f) * 0.5f);
  while (row * (row + 1) / 2 > index) --row;  // the float root may be one off either way
  while ((row + 1) * (row + 2) / 2 <= index) ++row;
  return {row, index - row * (row + 1) / 2};
}

// Per (b, h), on the lower triangle only: out[t, s] = sum_d x[t, d] y[s, d], d ascending. x is
// query head h's columns of the [B T, x_width] buffer x_data (q in qkv, or dy); y the columns
// of head y_head0 + h / group of qkv (k, or v). out is [B H T T]. Block x: a tile of the
// triangle; block y: (b, h).
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm)
    lower_products_kernel(float* out, const float* x_data, int x_width, const float* qkv, int y_head0,
                          AttentionShape s) {
  __shared__ Slice x_slice, y_slice;
  const TilePosition tile = lower_tile(static_cast<int>(blockIdx.x));
  const int row0 = tile.row * kTile, col0 = tile.col * kTile, group = s.H / s.Hkv, S = qkv_cols(s);
  for (int bh = static_cast<int>(blockIdx.y); bh < s.B * s.H; bh += static_cast<int>(gridDim.y)) {
    const int b = bh / s.H, h = bh % s.H;
    const Matrix x{x_data + at(b, 0, s.T, x_width, h * s.hs), x_width, s.T, s.hs, false};
    const Matrix y{qkv + at(b, 0, s.T, S, (y_head0 + h / group) * s.hs), S, s.T, s.hs, false};
    TileSums sums;
    for (int d0 = 0; d0 < s.hs; d0 += kSlice) {
      load_transposed(x_slice, x, row0, d0);
      load_transposed(y_slice, y, col0, d0);
      __syncthreads();
      sums.add(x_slice, y_slice);
      __syncthreads();  // before the next slice (or (b, h)) overwrites the shared slices
    }
    sums.store(out + static_cast<std::size_t>(bh) * s.T * s.T, s.T, s.T, s.T, true, row0, col0);
  }
}

// Per (b, h): out[t, d] = sum_{s <= t} P[t, s] z[s, d], s ascending. P is (b, h)'s T x T block
// of weights (att, or dS; lower triangle), z the columns of head z_head0 + h / group of qkv (v,
// or k); written to query head h's columns of the [B T, out_width] out (y, or dq in dqkv).
// Block x: (row tile, column tile), the longest rows first; block y: (b, h).
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm)
    lower_weights_kernel(float* out, int out_width, const float* weights, const float* qkv, int z_head0,
                         AttentionShape s) {
  __shared__ Slice p_slice, z_slice;
  const int col_tiles = (s.hs + kTile - 1) / kTile, row_tiles = (s.T + kTile - 1) / kTile;
  const int row0 = (row_tiles - 1 - static_cast<int>(blockIdx.x) / col_tiles) * kTile;
  const int col0 = static_cast<int>(blockIdx.x) % col_tiles * kTile;
  const int group = s.H / s.Hkv, S = qkv_cols(s);
  const int keys = min(s.T, row0 + kTile);  // rows of this tile read keys 0 .. keys - 1
  for (int bh = static_cast<int>(blockIdx.y); bh < s.B * s.H; bh += static_cast<int>(gridDim.y)) {
    const int b = bh / s.H, h = bh % s.H;
    const Matrix p{weights + static_cast<std::size_t>(bh) * s.T * s.T, s.T, s.T, s.T, true};
    const Matrix z{qkv + at(b, 0, s.T, S, (z_head0 + h / group) * s.hs), S, s.T, s.hs, false};
    TileSums sums;
    for (int k0 = 0; k0 < keys; k0 += kSlice) {
      load_transposed(p_slice, p, row0, k0);
      load_direct(z_slice, z, k0, col0);
      __syncthreads();
      sums.add(p_slice, z_slice);
      __syncthreads();
    }
    sums.store(out + at(b, 0, s.T, out_width, h * s.hs), out_width, s.T, s.hs, false, row0, col0);
  }
}

// Per (b, key/value head g): out[p, d] = sum over the group's query heads h in head order of
// sum_{t >= p} P_h[t, p] z_h[t, d], t ascending. P_h is (b, h)'s block of weights (dS, or att),
// z_h query head h's columns of the [B T, z_width] buffer z_data (q in qkv, or dy); written to
// head out_head0 + g of dqkv (k, or v). Block x: (row tile, column tile), the longest sums
// (first rows) first; block y: (b, g).
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm)
    lower_weights_transposed_kernel(float* dqkv, int out_head0, const float* weights, const float* z_data, int z_width,
                                    AttentionShape s) {
  __shared__ Slice p_slice, z_slice;
  const int col_tiles = (s.hs + kTile - 1) / kTile;
  const int row0 = static_cast<int>(blockIdx.x) / col_tiles * kTile;
  const int col0 = static_cast<int>(blockIdx.x) % col_tiles * kTile;
  const int group = s.H / s.Hkv, S = qkv_cols(s);
  for (int bg = static_cast<int>(blockIdx.y); bg < s.B * s.Hkv; bg += static_cast<int>(gridDim.y)) {
    const int b = bg / s.Hkv, g = bg % s.Hkv;
    TileSums sums;
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const Matrix p{weights + (static_cast<std::size_t>(b) * s.H + h) * s.T * s.T, s.T, s.T, s.T, true};
      const Matrix z{z_data + at(b, 0, s.T, z_width, h * s.hs), z_width, s.T, s.hs, false};
      for (int k0 = row0; k0 < s.T; k0 += kSlice) {  // queries t < row0 never see these keys
        load_direct(p_slice, p, k0, row0);
        load_direct(z_slice, z, k0, col0);
        __syncthreads();
        sums.add(p_slice, z_slice);
        __syncthreads();
      }
    }
    sums.store(dqkv + at(b, 0, s.T, S, (out_head0 + g) * s.hs), S, s.T, s.hs, false, row0, col0);
  }
}

// Queues a tiled kernel: `tiles` blocks along x, min(heads, kMaxGridY) along y (heads >= 1).
template <typename... Parameters, typename... Arguments>
void launch_tiles(void (*kernel)(Parameters...), long long tiles, int heads, Arguments... arguments) {
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(heads, kMaxGridY)));
  kernel<<<grid, kTileThreads, 0, current_stream()>>>(arguments...);
  SCAPE_CUDA_CHECK_LAUNCH();
}

// Tiles of a T x T lower triangle, and of a [T, hs] head output.
long long triangle_tiles(const AttentionShape& s) {
  const long long n = (s.T + kTile - 1) / kTile;
  return n * (n + 1) / 2;
}
long long head_tiles(const AttentionShape& s) {
  return static_cast<long long>((s.T + kTile - 1) / kTile) * ((s.hs + kTile - 1) / kTile);
}

// ---- softmax ---------------------------------------------------------------------------------

// Row t of each (b, h): p = exp((x - max) scale) / sum, tails flushed as on the CPU.
__global__ void softmax_kernel(float* att, int rows, int T, float scale) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int r = static_cast<int>(global_thread() / 32); r < rows; r += warps) {
    float* row = att + static_cast<std::size_t>(r) * T;
    const int len = r % T + 1;
    float m = -INFINITY;
    for (int j = lane; j < len; j += 32) m = fmaxf(m, row[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < len; j += 32) sum += expf((row[j] - m) * scale);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int j = lane; j < len; j += 32) row[j] = flush_subnormal(expf((row[j] - m) * scale) * inv);
  }
}

// In place: dS = A (dA - <A, dA>_row) scale, tails flushed.
__global__ void softmax_backward_kernel(float* datt, const float* att, int rows, int T, float scale) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int r = static_cast<int>(global_thread() / 32); r < rows; r += warps) {
    const float* a = att + static_cast<std::size_t>(r) * T;
    float* da = datt + static_cast<std::size_t>(r) * T;
    const int len = r % T + 1;
    float dot = 0.0f;
    for (int j = lane; j < len; j += 32) dot += a[j] * da[j];
    dot = warp_sum(dot);
    __syncwarp();
    for (int j = lane; j < len; j += 32) da[j] = flush_subnormal(a[j] * (da[j] - dot) * scale);
  }
}

// One thread per (row, pair); cos and sin in double, rounded once, as the CPU's table.
__global__ void rope_kernel(float* x, int N, int T, int stride, int width, int head_dim, double base, int direction) {
  const int pairs_per_row = width / 2, pairs = head_dim / 2;
  const std::size_t n = static_cast<std::size_t>(N) * pairs_per_row;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const int i = static_cast<int>(e / pairs_per_row), q = static_cast<int>(e % pairs_per_row);
    const int p = q % pairs;
    const double angle = static_cast<double>(i % T) * pow(base, -2.0 * static_cast<double>(p) / head_dim);
    const float c = static_cast<float>(cos(angle)), sn = static_cast<float>(direction * sin(angle));
    float* pair = x + static_cast<std::size_t>(i) * stride + 2 * q;
    const float x0 = pair[0], x1 = pair[1];
    pair[0] = x0 * c - x1 * sn;
    pair[1] = x0 * sn + x1 * c;
  }
}

void rope_rotate(std::span<float> x, int N, int T, int stride, int width, int head_dim, double base, int direction) {
  checks::rope(x.size(), N, T, stride, width, head_dim);
  if (N == 0 || width == 0) return;
  launch(rope_kernel, static_cast<std::size_t>(N) * (width / 2), x.data(), N, T, stride, width, head_dim, base,
         direction);
}

}  // namespace

void attention_forward(std::span<float> y, std::span<float> att, std::span<const float> qkv,
                       const AttentionShape& shape) {
  checks::attention(shape, y.size(), att.size(), qkv.size());
  const int heads = shape.B * shape.H, rows = heads * shape.T;
  if (heads == 0) return;  // H = 0: y and att are empty
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.hs));
  float* probs = att.data();
  launch_tiles(lower_products_kernel, triangle_tiles(shape), heads, probs, qkv.data(), shape.qkv_width(), qkv.data(),
               shape.H, shape);
  launch(softmax_kernel, static_cast<std::size_t>(rows) * 32, probs, rows, shape.T, scale);
  launch_tiles(lower_weights_kernel, head_tiles(shape), heads, y.data(), shape.y_width(),
               static_cast<const float*>(probs), qkv.data(), shape.H + shape.Hkv, shape);
}

void attention_backward(std::span<float> dqkv, std::span<float> datt, std::span<const float> dy,
                        std::span<const float> att, std::span<const float> qkv, const AttentionShape& shape) {
  checks::attention(shape, dy.size(), att.size(), qkv.size());
  checks::require_elements(dqkv.size(), qkv.size(), "attention_backward: dqkv");
  checks::require_elements(datt.size(), att.size(), "attention_backward: datt");
  const int heads = shape.B * shape.H, rows = heads * shape.T, S = shape.qkv_width();
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.hs));
  const float* dS = datt.data();
  if (heads > 0) {
    launch_tiles(lower_products_kernel, triangle_tiles(shape), heads, datt.data(), dy.data(), shape.y_width(),
                 qkv.data(), shape.H + shape.Hkv, shape);
    launch(softmax_backward_kernel, static_cast<std::size_t>(rows) * 32, datt.data(), att.data(), rows, shape.T,
           scale);
    launch_tiles(lower_weights_kernel, head_tiles(shape), heads, dqkv.data(), S, dS, qkv.data(), shape.H, shape);
  }
  // With H = 0 these write dk = dv = 0, so every element of dqkv is still written.
  launch_tiles(lower_weights_transposed_kernel, head_tiles(shape), shape.B * shape.Hkv, dqkv.data(), shape.H, dS,
               qkv.data(), S, shape);
  launch_tiles(lower_weights_transposed_kernel, head_tiles(shape), shape.B * shape.Hkv, dqkv.data(),
               shape.H + shape.Hkv, att.data(), dy.data(), shape.y_width(), shape);
}

void rope_forward(std::span<float> x, int N, int T, int stride, int width, int head_dim, double base) {
  rope_rotate(x, N, T, stride, width, head_dim, base, 1);
}

void rope_backward(std::span<float> dx, int N, int T, int stride, int width, int head_dim, double base) {
  rope_rotate(dx, N, T, stride, width, head_dim, base, -1);
}

}  // namespace scape::kernels::cuda
