// Transformer shapes for the predictor: named presets, the parameter count computed from the
// architecture, and the training FLOPs per token (docs/PREDICTING.md, "Model").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace scape::presets {

// gpt2: LayerNorm with bias, GELU MLP, biases on every linear layer, learned positions.
// llama: RMSNorm, SwiGLU MLP, no biases, rotary positions (no position parameters).
enum class Family { gpt2, llama };
const char* to_string(Family f);
// Throws std::invalid_argument naming `field` for anything but gpt2 or llama.
Family parse_family(std::string_view value, std::string_view field);

struct ModelSpec {
  Family family = Family::gpt2;
  int n_layer = 12;
  int n_embd = 768;
  int n_head = 12;
  int n_kv_head = 12;             // llama grouped-query attention; gpt2 uses n_head
  std::int64_t ffn_hidden = 3072;  // MLP hidden width (gpt2: 4 d; llama: the SwiGLU width)
  std::int64_t vocab_size = 50257;
  int context = 1024;              // gpt2: rows of the position table; default sequence length
  bool tied_embeddings = true;     // output head shares the token embedding
};

struct ModelPreset {
  const char* name;
  const char* description;
  const char* source;  // where the shape (and the published count, when there is one) comes from
  ModelSpec spec;
  std::uint64_t published_params;  // 0 when no count is published for this exact shape
};

const std::vector<ModelPreset>& model_presets();
// Throws std::invalid_argument naming `field` and listing the presets when unknown.
const ModelPreset& find_model_preset(std::string_view name, std::string_view field);

// The default SwiGLU width of the Llama papers: 8d/3 rounded up to a multiple of 256.
std::int64_t llama_ffn_hidden(int n_embd);

// Every trainable parameter (the N the optimizer steps and the collectives carry).
std::uint64_t parameter_count(const ModelSpec& m);
// Parameters that multiply activations: N minus tables that are only looked up (the position
// table of gpt2; the input token embedding when it is not tied to the output head).
std::uint64_t matmul_parameter_count(const ModelSpec& m);

// How the attention score and value products are counted (the parameter term does not cover
// them): causal 6 L T d per token (Kaplan et al. 2020, half of the full square), full
// 12 L T d (PaLM's MFU convention), none.
enum class AttentionFlops { causal, full, none };
const char* to_string(AttentionFlops a);
AttentionFlops parse_attention_flops(std::string_view value, std::string_view field);

// Training FLOPs per token (forward + backward = 3 x forward): 6 N_matmul + attention term.
double training_flops_per_token(const ModelSpec& m, int seq_len, AttentionFlops attention);

}  // namespace scape::presets
