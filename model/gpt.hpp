// GPT-2 language model with a hand-written backward pass over flat parameter and gradient
// buffers (Radford et al. 2019; structure follows karpathy/llm.c train_gpt2.c), written against
// the model ops of kernels/model_kernel_list.inc, so one code runs on the CPU and on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "model/gradient_ready.hpp"
#include "model/precision.hpp"

namespace scape::model {

struct GptConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 64;
  int block_size = 64;
  int vocab_size = 256;
  Precision precision = Precision::fp32;  // the linear layers' GEMMs (model/precision.hpp)

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

// The parameter layout of a config: wte, wpe, per block h.<i>.{attn_norm.w, attn_norm.bias,
// attn.qkv.w, attn.qkv.bias, attn.proj.w, attn.proj.bias, mlp_norm.w, mlp_norm.bias, mlp.fc.w,
// mlp.fc.bias, mlp.proj.w, mlp.proj.bias}, norm.w, norm.bias (norm and bias in the names, as
// SCAPE's dense_tensors default matches them). Linear weights are [out, in]. Only the matrices inside the blocks
// carry weight decay (embeddings, biases and LayerNorm do not).
ParamLayout gpt_layout(const GptConfig& cfg);

// Model FLOPs of one forward+backward per token at sequence length T: 6 per weight that takes
// part in a matmul (block matrices and the tied head; wpe, biases and LayerNorm excluded), plus
// attention over the causal triangle, 6 * n_layer * T * n_embd (half of PaLM's 12 L T C, which
// also counts the masked scores).
double train_flops_per_token(const GptConfig& cfg, int T);
// Bytes of the float model's activation workspace (activations kept for the backward, once-per-
// pass buffers, token ids) for B sequences of T tokens: what forward_backward allocates on its
// backend for that shape.
std::size_t workspace_bytes(const GptConfig& cfg, std::size_t B, std::size_t T);


// One model instance owns its activation workspace: use one per thread. Real is float for
// training and double for gradient checks; both share the layout. The float model runs its ops
// and keeps its workspace on `backend` (the CPU by default); params, grads, inputs and targets
// must then be memory that backend can access. The double model runs the CPU bodies of the
// same ops and accepts only the CPU backend. Threads: every parallel
// loop and Eigen product uses omp_get_max_threads() of the calling thread, so a worker that
// calls omp_set_num_threads(1) runs single-threaded (never call Eigen::setNbThreads, which is
// process-wide). The class touches no global mutable state.
template <class Real>
class BasicGpt {
 public:
  explicit BasicGpt(const GptConfig& cfg, kernels::KernelBackend& backend = kernels::cpu_backend());
  ~BasicGpt();
  BasicGpt(BasicGpt&&) noexcept;
  BasicGpt& operator=(BasicGpt&&) noexcept;
  BasicGpt(const BasicGpt&) = delete;
  BasicGpt& operator=(const BasicGpt&) = delete;

  const GptConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  std::size_t num_params() const { return layout_.size(); }

  // GPT-2 init: N(0, 0.02) for embeddings and matrices, residual projections (attn.proj.w,
  // mlp.proj.w) scaled by 1/sqrt(2 n_layer), biases 0, LayerNorm gain 1. Each element is a pure
  // function of (seed, tensor index, element index), drawn in double and rounded to Real.
  void init_params(std::span<Real> params, std::uint64_t seed) const;

  // Zeroes grads, runs forward and backward on B sequences of T <= block_size tokens (row-major
  // [B, T]) and returns the cross-entropy averaged over the B*T targets. `ready`, when set, hears
  // of each gradient range as the backward pass finishes it (model/gradient_ready.hpp).
  Real forward_backward(std::span<const Real> params, std::span<const std::int32_t> inputs,
                        std::span<const std::int32_t> targets, int B, int T, std::span<Real> grads,
                        const GradientReady& ready = {});

  // Forward only (evaluation); same mean loss as forward_backward.
  Real loss(std::span<const Real> params, std::span<const std::int32_t> inputs,
            std::span<const std::int32_t> targets, int B, int T);

 private:
  struct Workspace;
  void check_call(std::span<const Real> params, std::span<const std::int32_t> inputs,
                  std::span<const std::int32_t> targets, int B, int T) const;
  Real forward(const Real* params, const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
               bool keep_probs);
  void backward(const Real* params, int B, int T, Real* grads, const GradientReady& ready);

  GptConfig cfg_;
  ParamLayout layout_;
  kernels::KernelBackend* backend_;
  std::unique_ptr<Workspace> ws_;
};

using Gpt = BasicGpt<float>;
using GptDouble = BasicGpt<double>;

extern template class BasicGpt<float>;
extern template class BasicGpt<double>;

}  // namespace scape::model
