// Pieces the language models (model/gpt.cpp, model/llama.cpp) share: linear layers as model
// ops, GPT-2-style initialization over a layout, and the checks of a forward/backward call.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/layout.hpp"
#include "model/precision.hpp"

namespace scape::model {

// gemm or gemm_bf16 (kernels/model_kernel_list.inc) as the model's precision says.
template <class R, class Ops>
void matmul(Ops& ops, Precision p, bool trans_a, bool trans_b, int M, int N, int K, std::span<const R> a,
            std::span<const R> b, bool accumulate, std::span<R> c) {
  if (p == Precision::bf16) {
    ops.gemm_bf16(trans_a, trans_b, M, N, K, a, b, accumulate, c);
  } else {
    ops.gemm(trans_a, trans_b, M, N, K, a, b, accumulate, c);
  }
}

// out[N, OC] = (resid or 0) + (bias or 0) + in[N, IC] W[OC, IC]^T. Without a bias, a residual is
// not allowed (callers add it with residual_add).
template <class R, class Ops>
void linear_forward(Ops& ops, Precision p, std::span<R> out, std::span<const R> resid, std::span<const R> in,
                    std::span<const R> w, std::span<const R> bias, int N, int IC, int OC) {
  const bool has_bias = !bias.empty();
  if (has_bias) ops.bias_forward(out, resid, bias, N, OC);
  matmul<R>(ops, p, false, true, N, OC, IC, in, w, has_bias, out);
}

// dW += dY^T X, db += colsum(dY) (with a bias), dX = dY W.
template <class R, class Ops>
void linear_backward(Ops& ops, Precision p, std::span<R> dx, std::span<R> dw, std::span<R> db, std::span<const R> dy,
                     std::span<const R> x, std::span<const R> w, int N, int IC, int OC) {
  matmul<R>(ops, p, true, false, OC, IC, N, dy, x, true, dw);
  if (!db.empty()) ops.bias_backward(db, dy, N, OC);
  matmul<R>(ops, p, false, false, N, IC, OC, dy, w, false, dx);
}

// GPT-2 init over any of our layouts: N(0, 0.02) for embeddings and matrices, residual
// projections (names ending attn.proj.w, mlp.proj.w or mlp.down.w) scaled by 1/sqrt(2 n_layer),
// biases (".b" or ".bias") 0, norm gains (names starting "ln" or containing ".ln" or "norm") 1. Each
// element is a pure function of (seed, tensor index, element index), drawn in double and
// rounded to R.
template <class R>
void init_gpt2_style(const ParamLayout& layout, std::span<R> params, std::uint64_t seed, int n_layer,
                     const char* model);

void require(bool ok, const std::string& what);

// The checks of a forward/backward call, messages prefixed by `model` ("Gpt", "Llama").
void check_batch(const char* model, std::size_t params, std::size_t layout_size, std::span<const std::int32_t> inputs,
                 std::span<const std::int32_t> targets, int B, int T, int block_size, int vocab_size);

}  // namespace scape::model
