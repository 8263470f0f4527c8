// GPT-2 as a set of transformer parts (model/transformer.hpp): its config and the shape it
// resolves to.
#pragma once

#include "model/precision.hpp"
#include "model/transformer.hpp"

namespace scape::model {

struct GptConfig {
  int n_layer = 4;  // blocks
  int n_head = 4;
  int n_embd = 64;      // width C
  int block_size = 64;  // longest sequence, and the rows of wpe
  int vocab_size = 256;
  Precision precision = Precision::fp32;  // the linear layers' GEMMs (model/precision.hpp)

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

// GPT-2's parts: LayerNorm, a learned position table of block_size rows, a GELU MLP (of width
// 4 n_embd), biases on every matrix, the head tied to wte.
inline constexpr BlockParts kGpt2Parts{NormKind::layernorm, PositionKind::learned, MlpKind::gelu, /*linear_bias=*/true,
                                       /*tied_head=*/true};

// Validates cfg. Tensors: those transformer_layout gives these parts (wte, wpe, h.<i>.*, norm.*).
// The model (Radford et al. 2019) is FamilyModel<GptConfig, R>.
TransformerShape transformer_shape(const GptConfig& cfg);
using Gpt = FamilyModel<GptConfig, float>;
using GptDouble = FamilyModel<GptConfig, double>;

}  // namespace scape::model
