// Tensors of a predictor model shape (predict/model_layout.hpp).
#include "predict/model_layout.hpp"

#include "model/gpt.hpp"
#include "model/llama.hpp"

namespace scape::predict {

model::TransformerShape transformer_shape(const presets::ModelSpec& m) {
  const bool gpt2 = m.family == presets::Family::gpt2;
  model::TransformerShape s;
  s.family = "model";
  s.parts = gpt2 ? model::kGpt2Parts : model::kLlamaParts;
  s.parts.tied_head = m.tied_embeddings;
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.n_kv_head = gpt2 ? m.n_head : m.n_kv_head;
  s.n_embd = m.n_embd;
  s.block_size = m.context;
  s.vocab_size = static_cast<int>(m.vocab_size);
  s.ffn_hidden = static_cast<int>(m.ffn_hidden);
  return s;
}

ParamLayout tensor_layout(const presets::ModelSpec& m) {
  return model::transformer_layout(transformer_shape(m), ParamLayout::kUnbounded);
}

}  // namespace scape::predict
