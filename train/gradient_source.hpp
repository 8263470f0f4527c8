// Where a worker's gradients come from: the GPT model on its data shard, a recorded gradient
// trace (replay), or the noisy quadratic. Shared read-only data (token splits, the trace file)
// is loaded once per run in SourceData; each worker then builds its own GradientSource.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>
#include <mutex>
#include <span>

#include "config/config.hpp"
#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "kernels/device_span.hpp"
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
  // (NaN when unknown). params and grads are memory of the source's backend. A language model
  // tells `ready` of each gradient range as its backward pass finishes it
  // (model/gradient_ready.hpp), and starts `span` (when given) just before the pass's first
  // kernel, after the host has assembled the batch; the caller stops it. The quadratic and replay
  // sources produce the gradient at once on the host and use neither.
  virtual double gradient(std::span<const float> params, int step, std::span<float> grads,
                          const model::GradientReady& ready = {}, kernels::DeviceSpan* span = nullptr) = 0;
  // Validation loss over `batches` batches (NaN when the source has none).
  virtual double validation_loss(std::span<const float> params, int batches) = 0;
  // Whether validation_loss gives a number: rank 0 evaluates at the eval interval only then.
  virtual bool has_validation() const { return false; }
  // Whether a NaN training loss means "no loss" rather than a diverged run: a trace carries
  // none, and an external caller may give none.
  virtual bool loss_optional() const { return false; }
};

// model.type "external": the caller hands every step's gradients to RankLoop::step (the Python
// package) and may evaluate the parameters itself. Not made by load_source_data, which has no
// layout to give it: the caller builds it from its own.
class ExternalData final : public SourceData {
 public:
  // The validation loss of the parameters (NaN: none this time); empty: no validation.
  using Validation = std::function<double(std::span<const float> params)>;
  // `init` holds layout.size() values; throws std::invalid_argument otherwise.
  ExternalData(ParamLayout layout, std::vector<float> init, Validation validation = {});
  const ParamLayout& layout() const override { return layout_; }
  void init_params(std::span<float> params) const override;
  const Validation& validation() const { return validation_; }

 private:
  ParamLayout layout_;
  std::vector<float> init_;
  Validation validation_;
};

// Throws ConfigError naming the file or field for missing or corrupt input, and for model.type
// "external", whose data only its caller can build (ExternalData).
std::unique_ptr<SourceData> load_source_data(const config::ExperimentConfig& config);
// One language model, and so one activation workspace, that every worker of a simulated run
// uses in turn, holding `mutex` for a forward/backward or an evaluation: the workspace is
// allocated once instead of W times (the simulator on a GPU). Results are those of per-worker
// models bit for bit: a pass writes every activation before reading it and overwrites the
// whole gradient, so nothing carries from one worker's pass to the next (tested).
struct SharedModel {
  std::unique_ptr<model::LanguageModel> model;
  kernels::KernelBackend* backend = nullptr;  // the model's ops and workspace
  std::mutex mutex;
};

// nullptr for the quadratic and replay sources (no model).
std::unique_ptr<SharedModel> make_shared_model(const config::ExperimentConfig& config, const SourceData& data,
                                               kernels::KernelBackend& backend);

// A language model runs on `backend` (its memory must hold params and grads), or is `shared`'s
// when given; the quadratic and replay sources compute on the host (config parsing keeps them
// on the CPU).
std::unique_ptr<GradientSource> make_gradient_source(const config::ExperimentConfig& config, const SourceData& data,
                                                     int rank, kernels::KernelBackend& backend = kernels::cpu_backend(),
                                                     SharedModel* shared = nullptr);

}  // namespace scape::train
