// Gradient sources: a language model (GPT or Llama) on its data shard, replay of a trace, the
// noisy quadratic.
#include "train/gradient_source.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <mutex>

#include "config/model_shapes.hpp"
#include "model/data.hpp"
#include "model/language_model.hpp"
#include "run_file/trace.hpp"
#include "train/noisy_quadratic.hpp"

namespace scape::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();


model::TokenFormat detect_format(const std::filesystem::path& path, const std::string& format) {
  if (format == "nanogpt") return model::TokenFormat::kNanoGpt;
  if (format == "llmc") return model::TokenFormat::kLlmc;
  std::ifstream in(path, std::ios::binary);
  std::int32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in && magic == model::kLlmcMagic ? model::TokenFormat::kLlmc : model::TokenFormat::kNanoGpt;
}

class LanguageModelData final : public SourceData {
 public:
  explicit LanguageModelData(const config::ExperimentConfig& c)
      : spec_(config::language_model_spec(c.model)), seed_(c.seed) {
    try {
      spec_.validate();
      layout_ = spec_.layout();  // past 2^32 - 1 parameters: a config error, not a failure
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(e.what());
    }
    const int vocab_size = spec_.vocab_size();
    const auto& d = c.data;
    try {
      if (d.type == "synthetic") {
        model::MarkovConfig mc;
        mc.vocab_size = vocab_size;
        mc.successors = std::min(d.successors, vocab_size);
        mc.concentration = d.concentration;
        mc.seed = c.seed;
        split_ = model::synthetic_corpus(mc, static_cast<std::size_t>(d.tokens), d.val_fraction);
      } else if (d.type == "text") {
        if (vocab_size < 256) {
          throw config::ConfigError("model.vocab_size: text data is read as bytes and needs vocab_size >= 256, got " +
                                    std::to_string(vocab_size));
        }
        split_ = model::load_text_bytes(d.path.string(), d.val_fraction);
      } else {
        const auto tokens = model::read_tokens(d.path.string(), detect_format(d.path, d.format), vocab_size);
        split_ = model::split_tokens(tokens, d.val_fraction, vocab_size);
      }
    } catch (const model::DataError& e) {
      throw config::ConfigError(std::string("data.path: ") + e.what());
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(std::string("data: ") + e.what());
    }
    const auto need = static_cast<std::size_t>(spec_.block_size()) + 1;
    if (split_.train.size() < need || split_.val.size() < need) {
      throw config::ConfigError("data: the train split has " + std::to_string(split_.train.size()) +
                                " tokens and the validation split " + std::to_string(split_.val.size()) +
                                "; each needs at least block_size + 1 = " + std::to_string(need));
    }
  }
  const ParamLayout& layout() const override { return layout_; }
  void init_params(std::span<float> params) const override { spec_.make()->init_params(params, seed_); }
  const model::LanguageModelSpec& spec() const { return spec_; }
  const model::TokenSplit& split() const { return split_; }

 private:
  model::LanguageModelSpec spec_;
  std::uint64_t seed_;
  ParamLayout layout_;
  model::TokenSplit split_;
};

class LanguageModelSource final : public GradientSource {
 public:
  LanguageModelSource(const config::ExperimentConfig& c, const LanguageModelData& data, int rank,
                      kernels::KernelBackend& backend, SharedModel* shared)
      : own_(shared == nullptr ? data.spec().make(backend) : nullptr),
        backend_(shared == nullptr ? backend : *shared->backend),
        shared_(shared),
        train_(data.split().train, data.spec().block_size(), c.seed, model::Split::kTrain),
        val_(data.split().val, data.spec().block_size(), c.seed, model::Split::kVal),
        rank_(rank),
        workers_(c.workers),
        batch_(c.data.batch_size),
        T_(data.spec().block_size()),
        inputs_(static_cast<std::size_t>(batch_) * static_cast<std::size_t>(T_)),
        targets_(inputs_.size()) {}

  double gradient(std::span<const float> params, int step, std::span<float> grads,
                  const model::GradientReady& ready, kernels::DeviceSpan* span) override {
    train_.worker_batch(static_cast<std::uint64_t>(step), batch_ * workers_, workers_, rank_, inputs_, targets_);
    const auto lock = hold_model();
    if (span != nullptr) span->start();
    const double loss = model().forward_backward(params, inputs_, targets_, batch_, T_, grads, ready);
    backend_.synchronize();  // the backward may still be queued after the loss came back
    return loss;
  }

  bool has_validation() const override { return true; }
  double validation_loss(std::span<const float> params, int batches) override {
    // Evaluation batches are the validation split's steps 1..batches, whole global batches.
    const auto lock = hold_model();
    double sum = 0;
    for (int b = 1; b <= batches; ++b) {
      for (int r = 0; r < workers_; ++r) {
        val_.worker_batch(static_cast<std::uint64_t>(b), batch_ * workers_, workers_, r, inputs_, targets_);
        sum += model().loss(params, inputs_, targets_, batch_, T_);
      }
    }
    return sum / (batches * workers_);
  }

 private:
  model::LanguageModel& model() { return shared_ != nullptr ? *shared_->model : *own_; }
  std::unique_lock<std::mutex> hold_model() {
    return shared_ != nullptr ? std::unique_lock<std::mutex>(shared_->mutex) : std::unique_lock<std::mutex>();
  }

  std::unique_ptr<model::LanguageModel> own_;
  kernels::KernelBackend& backend_;
  SharedModel* shared_;
  model::BatchSampler train_, val_;
  int rank_, workers_, batch_, T_;
  std::vector<std::int32_t> inputs_, targets_;
};

class ReplayData final : public SourceData {
 public:
  explicit ReplayData(const config::ExperimentConfig& c) {
    try {
      trace_ = std::make_unique<run_file::GradientTrace>(c.model.path);
    } catch (const std::exception& e) {
      throw config::ConfigError(std::string("model.path: ") + e.what());
    }
    if (trace_->workers() != c.workers) {
      throw config::ConfigError("workers: " + std::to_string(c.workers) + " but the trace " + c.model.path.string() +
                                " holds gradients of " + std::to_string(trace_->workers()) + " workers");
    }
    if (c.steps > trace_->steps()) {
      throw config::ConfigError("steps: " + std::to_string(c.steps) + " exceeds the " +
                                std::to_string(trace_->steps()) + " steps recorded in " + c.model.path.string());
    }
    const auto& names = trace_->names();
    const auto& sizes = trace_->sizes();
    const auto& decay = trace_->decay();
    try {
      for (std::size_t i = 0; i < names.size(); ++i) layout_.add(names[i], {sizes[i]}, decay[i]);
    } catch (const std::invalid_argument& e) {
      // An empty or repeated name, or a zero size, read from the file.
      throw config::ConfigError("model.path: " + c.model.path.string() + ": '/layout' is not a valid layout (" +
                                e.what() + ")");
    }
  }
  const ParamLayout& layout() const override { return layout_; }
  void init_params(std::span<float> params) const override { trace_->read_init(params); }
  run_file::GradientTrace& trace() const { return *trace_; }

 private:
  std::unique_ptr<run_file::GradientTrace> trace_;
  ParamLayout layout_;
};

class ReplaySource final : public GradientSource {
 public:
  ReplaySource(const ReplayData& data, int rank) : data_(data), rank_(rank) {}
  double gradient(std::span<const float>, int step, std::span<float> grads, const model::GradientReady&,
                  kernels::DeviceSpan*) override {
    data_.trace().read_grad(step, rank_, grads);
    return kNaN;
  }
  double validation_loss(std::span<const float>, int) override { return kNaN; }
  bool loss_optional() const override { return true; }

 private:
  const ReplayData& data_;
  int rank_;
};

class QuadraticData final : public SourceData {
 public:
  explicit QuadraticData(const config::ExperimentConfig& c)
      : problem_(static_cast<std::size_t>(c.model.size), spec(c)) {
    layout_.add("theta", {static_cast<std::size_t>(c.model.size)}, true);
  }
  const ParamLayout& layout() const override { return layout_; }
  void init_params(std::span<float> params) const override { problem_.initial_params(params); }
  const train::NoisyQuadratic& problem() const { return problem_; }

 private:
  static train::QuadraticSpec spec(const config::ExperimentConfig& c) {
    train::QuadraticSpec s;
    s.seed = c.seed;
    s.noise = c.model.noise;
    s.curvature_tail = c.model.curvature_tail;
    return s;
  }
  train::NoisyQuadratic problem_;
  ParamLayout layout_;
};

class QuadraticSource final : public GradientSource {
 public:
  QuadraticSource(const QuadraticData& data, int rank) : data_(data), rank_(rank) {}
  double gradient(std::span<const float> params, int step, std::span<float> grads, const model::GradientReady&,
                  kernels::DeviceSpan*) override {
    data_.problem().gradient(params, step, rank_, grads);
    return data_.problem().loss(params);
  }
  double validation_loss(std::span<const float>, int) override { return kNaN; }

 private:
  const QuadraticData& data_;
  int rank_;
};

// The gradients come with each step (RankLoop::step's GivenGradient), never from here.
class ExternalSource final : public GradientSource {
 public:
  explicit ExternalSource(const ExternalData& data) : data_(data) {}
  double gradient(std::span<const float>, int step, std::span<float>, const model::GradientReady&,
                  kernels::DeviceSpan*) override {
    throw std::logic_error("model.type external: step " + std::to_string(step) +
                           " was taken without the caller's gradient");
  }
  double validation_loss(std::span<const float> params, int) override {
    return data_.validation() ? data_.validation()(params) : kNaN;
  }
  bool has_validation() const override { return static_cast<bool>(data_.validation()); }
  bool loss_optional() const override { return true; }

 private:
  const ExternalData& data_;
};

}  // namespace

ExternalData::ExternalData(ParamLayout layout, std::vector<float> init, Validation validation)
    : layout_(std::move(layout)), init_(std::move(init)), validation_(std::move(validation)) {
  if (init_.size() != layout_.size()) {
    throw std::invalid_argument("initial parameters: " + std::to_string(init_.size()) + " values for a layout of " +
                                std::to_string(layout_.size()));
  }
}

void ExternalData::init_params(std::span<float> params) const { std::copy(init_.begin(), init_.end(), params.begin()); }

std::unique_ptr<SourceData> load_source_data(const config::ExperimentConfig& config) {
  if (config.has_data()) return std::make_unique<LanguageModelData>(config);
  if (config.model.type == "replay") return std::make_unique<ReplayData>(config);
  if (config.model.type == "external") {
    throw config::ConfigError(
        "model.type: \"external\" gradients are handed in by a caller (the Python package's scape.Simulator and "
        "scape.torch); scape run has none to give: use gpt, llama, replay or quadratic");
  }
  return std::make_unique<QuadraticData>(config);
}

std::unique_ptr<SharedModel> make_shared_model(const config::ExperimentConfig& config, const SourceData& data,
                                               kernels::KernelBackend& backend) {
  if (!config.has_data()) return nullptr;
  auto shared = std::make_unique<SharedModel>();
  shared->model = static_cast<const LanguageModelData&>(data).spec().make(backend);
  shared->backend = &backend;
  return shared;
}

std::unique_ptr<GradientSource> make_gradient_source(const config::ExperimentConfig& config, const SourceData& data,
                                                     int rank, kernels::KernelBackend& backend, SharedModel* shared) {
  if (config.has_data()) {
    return std::make_unique<LanguageModelSource>(config, static_cast<const LanguageModelData&>(data), rank, backend,
                                                 shared);
  }
  if (config.model.type == "replay") return std::make_unique<ReplaySource>(static_cast<const ReplayData&>(data), rank);
  if (config.model.type == "external") return std::make_unique<ExternalSource>(static_cast<const ExternalData&>(data));
  return std::make_unique<QuadraticSource>(static_cast<const QuadraticData&>(data), rank);
}

}  // namespace scape::train
