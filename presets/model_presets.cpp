// Model presets, parameter counts and FLOPs per token (docs/PREDICTING.md, "Model").
#include "presets/model_presets.hpp"

#include "util/name_table.hpp"

namespace scape::presets {
namespace {

using U = std::uint64_t;

constexpr EnumName<Family> kFamilies[] = {{"gpt2", Family::gpt2}, {"llama", Family::llama}};
constexpr EnumName<AttentionFlops> kAttentionFlops[] = {
    {"causal", AttentionFlops::causal}, {"full", AttentionFlops::full}, {"none", AttentionFlops::none}};

ModelSpec gpt2(int layers, int width, int heads, std::int64_t vocab) {
  return ModelSpec{Family::gpt2, layers, width, heads, heads, 4 * static_cast<std::int64_t>(width), vocab, 1024, true};
}

ModelSpec llama(int layers, int width, int heads, int kv_heads, std::int64_t ffn, int context) {
  return ModelSpec{Family::llama, layers, width, heads, kv_heads, ffn, 32000, context, false};
}

// One transformer block. gpt2: ln1 (w, b), qkv (w, b), proj (w, b), ln2 (w, b), fc (w, b),
// proj (w, b). llama: q, k, v, o without bias (k and v at the grouped width), gate, up and
// down of SwiGLU, two RMSNorm weights.
U block_params(const ModelSpec& m) {
  const U d = static_cast<U>(m.n_embd);
  const U f = static_cast<U>(m.ffn_hidden);
  if (m.family == Family::gpt2) return 4 * d * d + 2 * d * f + 9 * d + f;
  const U kv_width = static_cast<U>(m.n_kv_head) * (d / static_cast<U>(m.n_head));
  return 2 * d * d + 2 * d * kv_width + 3 * d * f + 2 * d;
}

U token_embedding(const ModelSpec& m) { return static_cast<U>(m.vocab_size) * static_cast<U>(m.n_embd); }
U position_table(const ModelSpec& m) {
  return m.family == Family::gpt2 ? static_cast<U>(m.context) * static_cast<U>(m.n_embd) : 0;
}
// gpt2 ends with a LayerNorm (weight and bias), llama with an RMSNorm (weight).
U final_norm(const ModelSpec& m) { return (m.family == Family::gpt2 ? 2 : 1) * static_cast<U>(m.n_embd); }

}  // namespace

const char* to_string(Family f) { return name_of(kFamilies, f); }

Family parse_family(std::string_view value, std::string_view field) {
  return find_by_name(kFamilies, value, field, "family").value;
}

std::int64_t llama_ffn_hidden(int n_embd) {
  const std::int64_t raw = (8 * static_cast<std::int64_t>(n_embd) + 2) / 3;  // ceil(8d/3)
  return 256 * ((raw + 255) / 256);
}

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"gpt2-124m", "GPT-2 small: 12 layers, width 768, 12 heads, vocab 50257, context 1024, tied embeddings",
       "Radford et al. 2019; count of the openai-community/gpt2 checkpoint", gpt2(12, 768, 12, 50257), 124439808},
      {"gpt2-medium", "GPT-2 medium: 24 layers, width 1024, 16 heads, vocab 50257, context 1024, tied",
       "Radford et al. 2019; count of openai-community/gpt2-medium", gpt2(24, 1024, 16, 50257), 354823168},
      {"gpt2-large", "GPT-2 large: 36 layers, width 1280, 20 heads, vocab 50257, context 1024, tied",
       "Radford et al. 2019; count of openai-community/gpt2-large", gpt2(36, 1280, 20, 50257), 774030080},
      {"gpt2-xl", "GPT-2 XL: 48 layers, width 1600, 25 heads, vocab 50257, context 1024, tied",
       "Radford et al. 2019; count of openai-community/gpt2-xl", gpt2(48, 1600, 25, 50257), 1557611200},
      {"gpt-345m",
       "Megatron-LM GPT-345M: GPT-2 medium shape with the vocabulary padded to 50304 (a multiple of 128)",
       "Shoeybi et al. 2019 (Megatron-LM) shape; the SCAPE artifact's GPT-345M run logs print 354,871,296 "
       "(mz687/SCAPE_SC26 3c5bff8, the gpt-345M logs beside its launch scripts)",
       gpt2(24, 1024, 16, 50304), 354871296},
      {"llama-500m",
       "the SCAPE artifact's Llama-500M: 16 layers, width 1536, 16 heads (8 key-value groups), SwiGLU 4096, vocab "
       "32000, context 4096, untied",
       "mz687/SCAPE_SC26 ebb256c, slurm_scripts/vista/scaling_efficiency/*/500M_micro_bs_8/*.sh; its logs print "
       "513,590,784 parameters",
       llama(16, 1536, 16, 8, 4096, 4096), 513590784},
      {"llama-1.3b",
       "assumed Llama-style 1.3B: 24 layers, width 2048, 16 heads (8 key-value groups), SwiGLU 5632, vocab 32000, "
       "context 4096, untied",
       "assumption: the SCAPE artifact's memory figure has a Llama-1.3B row whose launch script is not in the "
       "repository", llama(24, 2048, 16, 8, 5632, 4096), 0},
      {"llama-1.8b",
       "the SCAPE artifact's Llama-1.8B: 24 layers, width 2560, 32 heads (8 key-value groups), SwiGLU 6912, vocab "
       "32000, context 2048, untied",
       "mz687/SCAPE_SC26 ebb256c, slurm_scripts/vista/scaling_efficiency/*/1.8B_micro_bs_8/*.sh (vocab: the Llama-2 "
       "tokenizer's 32000; the scripts also pass --vocab-size 128256, which would make 2.3B)",
       llama(24, 2560, 32, 8, 6912, 2048), 0},
      {"tinyllama-1.1b",
       "TinyLlama 1.1B: 22 layers, width 2048, 32 heads (4 key-value heads), SwiGLU 5632, vocab 32000, untied",
       "Zhang et al. 2024 (TinyLlama); count of the TinyLlama/TinyLlama_v1.1 checkpoint",
       llama(22, 2048, 32, 4, 5632, 2048), 1100048384},
      {"llama2-7b", "Llama 2 7B: 32 layers, width 4096, 32 heads, SwiGLU 11008, vocab 32000, context 4096, untied",
       "Touvron et al. 2023 (Llama 2); count of the meta-llama/Llama-2-7b-hf checkpoint",
       llama(32, 4096, 32, 32, 11008, 4096), 6738415616},
  };
  return presets;
}

const ModelPreset& find_model_preset(std::string_view name, std::string_view field) {
  return find_by_name(model_presets(), name, field, "model preset");
}

std::uint64_t parameter_count(const ModelSpec& m) {
  const U head = m.tied_embeddings ? 0 : token_embedding(m);
  return token_embedding(m) + position_table(m) + static_cast<U>(m.n_layer) * block_params(m) + final_norm(m) + head;
}

std::uint64_t matmul_parameter_count(const ModelSpec& m) {
  // A tied table is the output head (a matmul); an untied input table is only looked up.
  const U looked_up = position_table(m) + (m.tied_embeddings ? 0 : token_embedding(m));
  return parameter_count(m) - looked_up;
}

const char* to_string(AttentionFlops a) { return name_of(kAttentionFlops, a); }

AttentionFlops parse_attention_flops(std::string_view value, std::string_view field) {
  return find_by_name(kAttentionFlops, value, field).value;
}

double training_flops_per_token(const ModelSpec& m, int seq_len, AttentionFlops attention) {
  // QK^T and AV each take T d multiply-adds (2 T d FLOPs) per token and layer in the forward
  // pass, 4 T d together; training triples that to 12 T d. Causal masking halves it.
  const double per_layer_full = 12.0 * static_cast<double>(seq_len) * m.n_embd;
  const double factor = attention == AttentionFlops::full ? 1.0 : attention == AttentionFlops::causal ? 0.5 : 0.0;
  return 6.0 * static_cast<double>(matmul_parameter_count(m)) + factor * per_layer_full * m.n_layer;
}

}  // namespace scape::presets
