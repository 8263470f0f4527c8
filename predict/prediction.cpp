// Prediction over worker counts, baseline and efficiencies (docs/PREDICTING.md, "Outputs").
#include "predict/prediction.hpp"

#include "optimizers/device_state.hpp"
#include "predict/gemm_model.hpp"
#include "predict/model_layout.hpp"

namespace scape::predict {

double scaling_efficiency(const StepPrediction& whole_step_on_one_gpu, const StepPrediction& at_w) {
  return whole_step_on_one_gpu.step_s / (at_w.workers * at_w.step_s);
}

StepInputs step_inputs(const PredictConfig& c, const OptimizerConfig& optimizer) {
  StepInputs in;
  in.optimizer = optimizer;
  in.layout = tensor_layout(c.model);
  in.n_params = in.layout.size();
  in.flops_per_token = presets::training_flops_per_token(c.model, c.batch.seq_len, c.attention);
  if (c.gemm_curve.fitted()) {
    const ComputeWork work = compute_work(c.model, c.batch.seq_len, static_cast<int>(c.batch.micro_sequences));
    in.compute_s_per_token = compute_seconds(work, c.gemm_curve).total(c.gemm_curve) / work.tokens;
  }
  in.fill_in = c.fill_in;
  in.gpu = c.gpu;
  in.topology = c.topology();
  in.overlap = c.overlap;
  return in;
}

OptimizerMemory optimizer_memory(const PredictConfig& c, const OptimizerConfig& optimizer, const ParamLayout& layout,
                                 int workers) {
  OptimizerMemory m;
  if (!has_device_bytes(optimizer.type)) return m;
  OptimizerConfig o = optimizer;
  if (o.hierarchy == Hierarchy::node) o.ranks_per_node = place(c.topology(), workers).gpus_per_node;
  m.state_bytes = static_cast<double>(optimizer_state_bytes(o, layout, workers));
  m.bytes = static_cast<double>(optimizer_device_bytes(o, layout, workers));
  return m;
}

Prediction run_prediction(const PredictConfig& c) {
  Prediction p;
  p.config = c;
  p.n_params = presets::parameter_count(c.model);
  p.flops_per_token = presets::training_flops_per_token(c.model, c.batch.seq_len, c.attention);
  const StepInputs opt = step_inputs(c, c.optimizer);
  const StepInputs base = step_inputs(c, c.baseline);
  for (const int w : c.workers) {
    // The reference is one GPU doing the whole W-GPU step: its global batch and the optimizer
    // step over all N once. Under weak scaling a reference with only one GPU's batch would
    // still step all N, which the W GPUs share (sharding, partitioned ranking), and put the
    // efficiency above 1 (1.012 at W = 64 before).
    const StepPrediction opt_one = predict_step(opt, 1, c.batch.global_tokens(w));
    const StepPrediction base_one = predict_step(base, 1, c.batch.global_tokens(w));
    PredictionRow r;
    r.workers = w;
    r.global_tokens = c.batch.global_tokens(w);
    r.optimizer = predict_step(opt, w, c.batch.tokens_per_gpu(w));
    r.baseline = predict_step(base, w, c.batch.tokens_per_gpu(w));
    r.optimizer_memory = optimizer_memory(c, c.optimizer, opt.layout, w);
    r.baseline_memory = optimizer_memory(c, c.baseline, base.layout, w);
    r.speedup = r.baseline.step_s / r.optimizer.step_s;
    r.efficiency = scaling_efficiency(opt_one, r.optimizer);
    r.baseline_efficiency = scaling_efficiency(base_one, r.baseline);
    p.rows.push_back(std::move(r));
  }
  return p;
}

}  // namespace scape::predict
