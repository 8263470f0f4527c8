// The tensors of a predictor model shape, so that SCAPE's per-tensor k, its owners and the
// dense_tensors exclusion are counted in `scape predict` as the optimizer counts them
// (docs/PREDICTING.md, "Model").
#pragma once

#include "core/layout.hpp"
#include "model/transformer.hpp"
#include "presets/model_presets.hpp"

namespace scape::predict {

// The shape as the model code builds it (model/transformer.hpp): gpt2 takes GPT-2's parts and
// llama Llama's, with the MLP width, the head tying and the position rows (context) of m.
// Error messages name the section "model".
model::TransformerShape transformer_shape(const presets::ModelSpec& m);

// Its layout, unbounded (it may exceed 2^32 elements, as no optimizer steps it); its size is
// presets::parameter_count(m). Throws std::invalid_argument naming the field for a shape the model code
// cannot build (n_embd not a multiple of n_head, an odd head dimension under llama, n_kv_head
// not dividing n_head).
ParamLayout tensor_layout(const presets::ModelSpec& m);

}  // namespace scape::predict
