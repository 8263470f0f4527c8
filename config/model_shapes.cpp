// The model section read for the model library and for the predictor.
#include "config/model_shapes.hpp"

#include <cstdint>

#include "model/llama.hpp"

namespace scape::config {

model::LanguageModelSpec language_model_spec(const ModelSection& m) {
  model::LanguageModelSpec spec;
  spec.type = m.type;
  spec.gpt = {.n_layer = m.n_layer,
              .n_head = m.n_head,
              .n_embd = m.n_embd,
              .block_size = m.block_size,
              .vocab_size = m.vocab_size,
              .precision = model::parse_precision(m.precision)};
  spec.llama = {.n_layer = m.n_layer,
                .n_head = m.n_head,
                .n_kv_head = m.n_kv_head,
                .n_embd = m.n_embd,
                .block_size = m.block_size,
                .vocab_size = m.vocab_size,
                .precision = model::parse_precision(m.precision),
                .ffn_hidden = m.ffn_hidden};
  return spec;
}

presets::ModelSpec predictor_model_spec(const ModelSection& m) {
  presets::ModelSpec s;
  s.n_layer = m.n_layer;
  s.n_embd = m.n_embd;
  s.n_head = m.n_head;
  s.vocab_size = m.vocab_size;
  s.context = m.block_size;
  if (m.type == "llama") {
    s.family = presets::Family::llama;
    s.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
    s.ffn_hidden = m.ffn_hidden > 0 ? m.ffn_hidden : model::default_ffn_hidden(m.n_embd);
    s.tied_embeddings = false;
    return s;
  }
  s.family = presets::Family::gpt2;
  s.n_kv_head = m.n_head;
  s.ffn_hidden = 4 * static_cast<std::int64_t>(m.n_embd);
  s.tied_embeddings = true;
  return s;
}

}  // namespace scape::config
