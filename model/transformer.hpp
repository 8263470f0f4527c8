// The decoder-only transformer both language model families are built from: one block skeleton
// (norm, qkv projection, position encoding, attention, projection with residual, norm, MLP with
// residual; then a final norm and the output head), a hand-written backward pass over flat
// parameter and gradient buffers, written against the model ops of kernels/model_kernel_list.inc
// so one code runs on the CPU and on CUDA. A family (model/gpt.hpp, model/llama.hpp) is a set of
// BlockParts and a config that resolves to a TransformerShape; a new family is a new set of
// parts (docs/CONTRIBUTING.md, "Add a model family").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "model/gradient_ready.hpp"
#include "model/precision.hpp"

namespace scape::model {

// layernorm: gain and shift, mean and variance (GPT-2). rmsnorm: gain only (Llama).
enum class NormKind { layernorm, rmsnorm };
// learned: a position table wpe added to the token embedding. rotary: RoPE on q and k
// (interleaved pairs), no parameters.
enum class PositionKind { learned, rotary };
// gelu: fc [F, C], GELU, proj [C, F]. swiglu: gate_up [2 F, C] (gate rows, then up rows),
// SwiGLU, down [C, F].
enum class MlpKind { gelu, swiglu };

struct BlockParts {
  NormKind norm = NormKind::layernorm;
  PositionKind position = PositionKind::learned;
  MlpKind mlp = MlpKind::gelu;
  bool linear_bias = true;  // a bias on the qkv, projection and both MLP matrices
  bool tied_head = true;    // the output head is wte (else its own lm_head.w)
};

// Every size resolved (no 0-means-default): what the skeleton runs.
struct TransformerShape {
  std::string family = "Transformer";  // prefixes error messages ("Gpt", "Llama")
  BlockParts parts;
  int n_layer = 1;
  int n_head = 1;
  int n_kv_head = 1;  // key/value heads (grouped-query attention); n_head for none
  int n_embd = 8;
  int block_size = 8;  // longest sequence; rows of wpe under learned positions
  int vocab_size = 8;
  int ffn_hidden = 32;  // F: the MLP's hidden width
  Precision precision = Precision::fp32;
  double rope_base = 10000.0;
  double norm_eps = 1e-5;

  int head_dim() const { return n_embd / n_head; }
  int qkv_width() const { return (n_head + 2 * n_kv_head) * head_dim(); }
  // Rows of the MLP's first matrix: F (gelu) or 2 F (swiglu).
  int mlp_up_width() const { return parts.mlp == MlpKind::swiglu ? 2 * ffn_hidden : ffn_hidden; }

  // Throws std::invalid_argument naming `prefix`.field: sizes below 1, n_embd not a multiple of
  // n_head, an odd head dimension under rotary positions, n_kv_head not dividing n_head.
  void validate(const std::string& prefix) const;
};

// Tensor names (norm and bias in the names, as SCAPE's dense_tensors default matches them):
// wte [V, C], wpe [block_size, C] (learned positions), per block h.<i>.{attn_norm.w,
// attn_norm.bias, attn.qkv.w [qkv_width, C], attn.qkv.bias, attn.proj.w [C, C], attn.proj.bias,
// mlp_norm.w, mlp_norm.bias, mlp.fc.w [F, C] or mlp.gate_up.w [2 F, C], its bias, mlp.proj.w
// [C, F] or mlp.down.w [C, F], its bias}, norm.w, norm.bias, lm_head.w [V, C] (untied); the
// .bias of a norm only under layernorm, of a matrix only with linear_bias. Weight decay: every
// matrix that multiplies activations (the block matrices and an untied lm_head); embeddings,
// biases and norm gains do not. max_elements: ParamLayout's limit (kUnbounded for the
// predictor's closed forms, which describe models no optimizer here steps).
ParamLayout transformer_layout(const TransformerShape& shape, std::size_t max_elements = ParamLayout::kMaxIndexed);

// Slot indices of a shape's tensors in its layout, kNoSlot where its parts have none.
inline constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);
struct TransformerBlockSlots {
  std::size_t norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, norm2_w, norm2_b, up_w, up_b, down_w, down_b;
};
struct TransformerSlots {
  std::size_t wte = 0, wpe = kNoSlot, norm_w = 0, norm_b = kNoSlot, head = 0;
  std::vector<TransformerBlockSlots> blocks;
};
// The layout and where each tensor sits in it (transformer_layout is its .first).
std::pair<ParamLayout, TransformerSlots> transformer_tensors(const TransformerShape& shape,
                                                             std::size_t max_elements = ParamLayout::kMaxIndexed);

// Model FLOPs of one forward+backward per token at sequence length T: 6 per weight that takes
// part in a matmul (the block matrices and the head; wpe, biases and norms excluded), plus
// attention over the causal triangle, 6 * n_layer * T * n_embd (half of PaLM's 12 L T C, which
// also counts the masked scores).
double train_flops_per_token(const TransformerShape& shape, int T);
// Bytes of the float model's activation workspace (activations kept for the backward, once-per-
// pass buffers, token ids) for B sequences of T tokens: what forward_backward allocates on its
// backend for that shape.
std::size_t workspace_bytes(const TransformerShape& shape, std::size_t B, std::size_t T);

// One model instance owns its activation workspace: use one per thread. Real is float for
// training and double for gradient checks; both share the layout. The float model runs its ops
// and keeps its workspace on `backend` (the CPU by default); params, grads, inputs and targets
// must then be memory that backend can access. The double model runs the CPU bodies of the
// same ops and accepts only the CPU backend. Threads: every parallel loop and Eigen product uses
// omp_get_max_threads() of the calling thread, so a worker that calls omp_set_num_threads(1)
// runs single-threaded (never call Eigen::setNbThreads, which is process-wide). The class
// touches no global mutable state.
template <class Real>
class BasicTransformer {
 public:
  // Throws std::invalid_argument for an invalid shape, or a double model on a device.
  explicit BasicTransformer(const TransformerShape& shape, kernels::KernelBackend& backend = kernels::cpu_backend());
  ~BasicTransformer();
  BasicTransformer(BasicTransformer&&) noexcept;
  BasicTransformer& operator=(BasicTransformer&&) noexcept;
  BasicTransformer(const BasicTransformer&) = delete;
  BasicTransformer& operator=(const BasicTransformer&) = delete;

  const TransformerShape& shape() const { return shape_; }
  const ParamLayout& layout() const { return layout_; }
  std::size_t num_params() const { return layout_.size(); }

  // GPT-2 init: N(0, 0.02) for embeddings and matrices, residual projections (attn.proj.w,
  // mlp.proj.w, mlp.down.w) scaled by 1/sqrt(2 n_layer), biases 0, norm gains 1. Each element is
  // a pure function of (seed, tensor index, element index), drawn in double and rounded to Real.
  void init_params(std::span<Real> params, std::uint64_t seed) const;

  // Zeroes grads, runs forward and backward on B sequences of T <= block_size tokens (row-major
  // [B, T]) and returns the cross-entropy averaged over the B*T targets. `ready`, when set, hears
  // of each gradient range as the backward pass finishes it (model/gradient_ready.hpp).
  Real forward_backward(std::span<const Real> params, std::span<const std::int32_t> inputs,
                        std::span<const std::int32_t> targets, int B, int T, std::span<Real> grads,
                        const GradientReady& ready = {});

  // Forward only (evaluation); same mean loss as forward_backward.
  Real loss(std::span<const Real> params, std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
            int B, int T);

 private:
  struct Workspace;
  void check_call(std::span<const Real> params, std::span<const std::int32_t> inputs,
                  std::span<const std::int32_t> targets, int B, int T) const;
  Real forward(const Real* params, const std::int32_t* inputs, const std::int32_t* targets, int B, int T, bool grad);
  void backward(const Real* params, int B, int T, Real* grads, const GradientReady& ready);

  TransformerShape shape_;
  ParamLayout layout_;
  TransformerSlots slots_;
  kernels::KernelBackend* backend_;
  std::unique_ptr<Workspace> ws_;
};

extern template class BasicTransformer<float>;
extern template class BasicTransformer<double>;

// A family's model built from its config: the skeleton with transformer_shape(cfg) (the
// family's overload, which validates cfg), and the config it was given.
template <class Config, class Real>
class FamilyModel : public BasicTransformer<Real> {
 public:
  explicit FamilyModel(const Config& cfg, kernels::KernelBackend& backend = kernels::cpu_backend())
      : BasicTransformer<Real>(transformer_shape(cfg), backend), cfg_(cfg) {}
  const Config& config() const { return cfg_; }

 private:
  Config cfg_;
};

// The sizes every family's config names alike (n_kv_head = n_head; the family sets the rest).
template <class Config>
TransformerShape shape_with_common_sizes(const char* family, const BlockParts& parts, const Config& cfg) {
  TransformerShape s;
  s.family = family;
  s.parts = parts;
  s.n_layer = cfg.n_layer;
  s.n_head = cfg.n_head;
  s.n_kv_head = cfg.n_head;
  s.n_embd = cfg.n_embd;
  s.block_size = cfg.block_size;
  s.vocab_size = cfg.vocab_size;
  s.precision = cfg.precision;
  return s;
}

}  // namespace scape::model
