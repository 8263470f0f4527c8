// Where a worker's gradients come from: the GPT model on its data shard, a recorded gradient
// trace (replay), or the noisy quadratic. Shared read-only data (token splits, the trace file)
// is loaded once per run in SourceData; each worker then builds its own GradientSource.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/layout.hpp"
#include "experiments/config.hpp"
#include "kernels/backend.hpp"
#include "model/language_model.hpp"

namespace scape::train {

// Loaded once per run, shared by the workers (read-only after construction).
class SourceData {
 public:
  virtual ~SourceData() = default;
  virtual const ParamLayout& layout() const = 0;
  virtual void init_params(std::span<float> params) const = 0;
};

class GradientSource {
 public:
  virtual ~GradientSource() = default;
  // This worker's gradient at step t (1-based), complete on return; returns its training loss
  // (NaN when unknown). params and grads are memory of the source's backend.
  virtual double gradient(std::span<const float> params, int step, std::span<float> grads) = 0;
  // Validation loss over `batches` batches (NaN when the source has none).
  virtual double validation_loss(std::span<const float> params, int batches) = 0;
};

// The GPT or Llama shape of a model section (gpt and llama types).
model::LanguageModelSpec language_model_spec(const experiments::ModelSection& m);

// Throws ConfigError naming the file or field for missing or corrupt input.
std::unique_ptr<SourceData> load_source_data(const experiments::ExperimentConfig& config);
// A language model runs on `backend` (its memory must hold params and grads); the quadratic and
// replay sources compute on the host (config parsing keeps them on the CPU).
std::unique_ptr<GradientSource> make_gradient_source(const experiments::ExperimentConfig& config,
                                                     const SourceData& data, int rank,
                                                     kernels::KernelBackend& backend = kernels::cpu_backend());

}  // namespace scape::train
