// Llama-style models (Touvron et al. 2023) as a set of transformer parts (model/transformer.hpp):
// RMSNorm before attention and MLP and at the end, rotary position embeddings (interleaved
// pairs), a SwiGLU MLP, no biases, an untied output matrix, and optional grouped-query attention.
#pragma once

#include "model/precision.hpp"
#include "model/transformer.hpp"

namespace scape::model {

struct LlamaConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;  // key/value heads; 0 means n_head (no grouping)
  int n_embd = 64;
  int block_size = 64;
  int vocab_size = 256;
  Precision precision = Precision::fp32;  // the linear layers' GEMMs (model/precision.hpp)
  int ffn_hidden = 0;                     // SwiGLU hidden size; 0 means 8/3 n_embd rounded up to a multiple of 64
  double rope_base = 10000.0;
  double norm_eps = 1e-5;

  int kv_heads() const { return n_kv_head == 0 ? n_head : n_kv_head; }
  int head_dim() const { return n_embd / n_head; }
  int hidden() const;

  // Throws std::invalid_argument naming the offending field: n_embd not divisible by n_head, an
  // odd head dimension (RoPE rotates pairs), n_kv_head not dividing n_head, non-positive sizes.
  void validate() const;
};

// The default SwiGLU hidden size: ceil(8 n_embd / 3) rounded up to a multiple of 64.
int default_ffn_hidden(int n_embd);

// Llama's parts: RMSNorm, rotary positions, a SwiGLU MLP (of width hidden()), no biases, an
// untied output matrix.
inline constexpr BlockParts kLlamaParts{NormKind::rmsnorm, PositionKind::rotary, MlpKind::swiglu, /*linear_bias=*/false,
                                        /*tied_head=*/false};

// Validates cfg; n_kv_head 0 means n_head, ffn_hidden 0 the default width. Tensors: those
// transformer_layout gives these parts (wte, h.<i>.*, norm.w, lm_head.w). The model (Touvron et al.
// 2023) is FamilyModel<LlamaConfig, R>.
TransformerShape transformer_shape(const LlamaConfig& cfg);
using Llama = FamilyModel<LlamaConfig, float>;
using LlamaDouble = FamilyModel<LlamaConfig, double>;

}  // namespace scape::model
