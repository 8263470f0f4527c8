// Argument checks of the model ops (kernels/model_kernel_list.inc), shared by the CPU and CUDA
// bodies so a bad call throws the same std::invalid_argument on either device, before any work
// is queued. Every buffer must have exactly the size its shape implies.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/kernel_types.hpp"

namespace scape::kernels::checks {

inline std::size_t elements(long long rows, long long cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("model op: negative dimension");
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

// `what` names the op and the argument, e.g. "gemm: a".
inline void require_elements(std::size_t got, std::size_t want, const char* what) {
  if (got != want) {
    throw std::invalid_argument(std::string(what) + ": buffer holds " + std::to_string(got) +
                                " entries, the shape needs " + std::to_string(want));
  }
}

inline void require_shape(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

inline void gemm(int M, int N, int K, std::size_t a, std::size_t b, std::size_t c) {
  require_elements(a, elements(M, K), "gemm: a");
  require_elements(b, elements(K, N), "gemm: b");
  require_elements(c, elements(M, N), "gemm: c");
}

// The embedding's forward and backward: activations `acts` (out or dout) of [B T, C], B T
// tokens, and the position table `positions` (wpe or dwpe) of [T, C] when the model has one
// (`has_positions`). Names the argument as "op: <name>". Returns B T.
inline std::size_t embedding(const char* op, int B, int T, int C, std::size_t acts, const char* acts_name,
                             std::size_t tokens, bool has_positions, std::size_t positions,
                             const char* positions_name) {
  const std::string prefix = std::string(op) + ": ";
  const std::size_t N = elements(B, T);
  require_elements(acts, elements(static_cast<long long>(N), C), (prefix + acts_name).c_str());
  require_elements(tokens, N, (prefix + "tokens").c_str());
  if (has_positions) require_elements(positions, elements(T, C), (prefix + positions_name).c_str());
  return N;
}

// A row-wise op over [N, C] rows with per-row statistics (norms).
inline void rows(const char* op, int N, int C, std::size_t out, std::size_t x, std::size_t stats) {
  require_shape(N >= 0 && C >= 1, std::string(op) + ": N = " + std::to_string(N) + ", C = " + std::to_string(C));
  require_elements(out, elements(N, C), op);
  require_elements(x, elements(N, C), op);
  require_elements(stats, static_cast<std::size_t>(N), op);
}

inline void rope(std::size_t x, int N, int T, int stride, int width, int head_dim) {
  require_shape(T >= 1 && head_dim >= 2 && head_dim % 2 == 0 && width % head_dim == 0 && width <= stride,
                "rope: T = " + std::to_string(T) + ", head_dim = " + std::to_string(head_dim) +
                    " (must be even), width = " + std::to_string(width) +
                    " (a multiple of head_dim, <= stride = " + std::to_string(stride) + ")");
  require_elements(x, elements(N, stride), "rope: x");
}

inline void attention(const AttentionShape& s, std::size_t y, std::size_t att, std::size_t qkv) {
  require_shape(s.B >= 1 && s.T >= 1 && s.hs >= 1 && s.Hkv >= 1 && s.H % s.Hkv == 0,
                "attention: B = " + std::to_string(s.B) + ", T = " + std::to_string(s.T) + ", H = " +
                    std::to_string(s.H) + " (a multiple of Hkv = " + std::to_string(s.Hkv) + "), hs = " +
                    std::to_string(s.hs));
  const long long N = static_cast<long long>(s.B) * s.T;
  require_elements(y, elements(N, s.y_width()), "attention: y");
  require_elements(att, elements(static_cast<long long>(s.B) * s.H, static_cast<long long>(s.T) * s.T),
                   "attention: att");
  require_elements(qkv, elements(N, s.qkv_width()), "attention: qkv");
}

}  // namespace scape::kernels::checks
