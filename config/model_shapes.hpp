// The model a config's model section names, as the model library builds it and as the
// predictor counts its parameters and FLOPs: one reading of the section for both.
#pragma once

#include "config/config.hpp"
#include "model/language_model.hpp"
#include "presets/model_presets.hpp"

namespace scape::config {

// The GPT or Llama shape of a model section (gpt and llama types).
model::LanguageModelSpec language_model_spec(const ModelSection& m);

// The same shape as the predictor describes models: GPT-2 blocks with tied embeddings and a
// position table of block_size rows (model/gpt.hpp), or Llama blocks with an untied head,
// grouped-query attention and the SwiGLU width the model builds (model/llama.hpp).
presets::ModelSpec predictor_model_spec(const ModelSection& m);

}  // namespace scape::config
