// The artifact's table rows on the step model, and the fit to a measured table
// (predict/table_model.hpp).
#include "predict/table_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "predict/model_layout.hpp"
#include "presets/gpu_presets.hpp"

namespace scape::predict {
namespace {

constexpr int kParams = 4;  // 1/FLOP/s, alpha, 1/beta, 1/optimizer throughput
using Row = std::array<double, kParams>;

// Solves the least-squares problem min |A x - 1|^2 over the columns in `use` (the others 0),
// by the normal equations; false when they are singular.
bool solve_subset(const std::vector<Row>& a, unsigned use, Row& x) {
  std::array<std::array<double, kParams + 1>, kParams> m{};
  std::array<int, kParams> cols{};
  int n = 0;
  for (int j = 0; j < kParams; ++j) {
    if (use & (1u << j)) cols[static_cast<std::size_t>(n++)] = j;
  }
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) {
      for (const Row& row : a) m[r][c] += row[cols[r]] * row[cols[c]];
    }
    for (const Row& row : a) m[r][n] += row[cols[r]];
  }
  for (int p = 0; p < n; ++p) {  // Gauss-Jordan with partial pivoting
    int best = p;
    for (int r = p + 1; r < n; ++r) {
      if (std::abs(m[r][p]) > std::abs(m[best][p])) best = r;
    }
    if (!(std::abs(m[best][p]) > 1e-300)) return false;
    std::swap(m[p], m[best]);
    for (int r = 0; r < n; ++r) {
      if (r == p) continue;
      const double f = m[r][p] / m[p][p];
      for (int c = p; c <= n; ++c) m[r][c] -= f * m[p][c];
    }
  }
  x.fill(0);
  for (int r = 0; r < n; ++r) x[cols[r]] = m[r][n] / m[r][r];
  return true;
}

// Non-negative least squares over four parameters: the best of the subsets whose solution is
// positive (an empty or negative parameter means the data cannot support it).
Row nonnegative_fit(const std::vector<Row>& a) {
  Row best{};
  double best_err = std::numeric_limits<double>::infinity();
  for (unsigned use = 1; use < (1u << kParams); ++use) {
    Row x;
    if (!solve_subset(a, use, x)) continue;
    bool ok = true;
    for (int j = 0; j < kParams; ++j) ok = ok && ((use & (1u << j)) == 0 || x[j] > 0);
    if (!ok) continue;
    double err = 0;
    for (const Row& row : a) {
      double p = 0;
      for (int j = 0; j < kParams; ++j) p += row[j] * x[j];
      err += (p - 1) * (p - 1);
    }
    if (err < best_err) best_err = err, best = x;
  }
  if (!std::isfinite(best_err)) throw std::invalid_argument("fit_step_table: no positive solution");
  return best;
}

// A calibration with every rate 1 and a link of alpha 0: predict_step then reports the
// amounts each parameter multiplies.
Calibration unit_calibration() {
  Calibration c;
  c.achieved_flops = c.optimizer_Bps = 1;
  c.combined = LinkFit{0, 1, 0};
  return c;
}

double tokens_per_gpu(const MeasuredRow& r) {
  const TimingSetup& s = timing_setup(r.model);
  return static_cast<double>(s.global_batch) * s.seq_len / r.gpus;
}

// The amounts of one row: the compute at unit rate (FLOPs, or the GEMMs' seconds at
// max_efficiency 1 on `shape`), ring latency steps and bytes of the blocking collectives,
// optimizer bytes; and the seconds no parameter multiplies, which the fit subtracts: the exposed
// offload under `current` and, under the GEMM model, the elementwise kernels.
Row amounts(const MeasuredRow& r, double& fixed_s, const Calibration& current, TableCompute compute,
            const presets::GemmCurve& shape) {
  const StepPrediction p = predict_table_row(unit_calibration(), r);
  Row x{p.compute_s(), 0, 0, p.optimizer_bytes};
  for (const auto& c : p.collectives) {
    if (c.window != Window::none) continue;
    x[1] += c.record.latency_steps;
    x[2] += c.record.bytes_sent_per_worker;
  }
  fixed_s = current.achieved_flops > 0 ? predict_table_row(current, r).offload_exposed_s : 0.0;
  if (compute == TableCompute::gemm) {
    Calibration unit;
    unit.gemm = shape;
    unit.gemm.max_efficiency = 1;
    const ComputeSeconds per_token = table_compute_per_token(unit, timing_setup(r.model));
    x[0] = per_token.gemm_at_full_efficiency * tokens_per_gpu(r);
    fixed_s += per_token.elementwise * tokens_per_gpu(r);
  }
  return x;
}

// The fitted parameters as a calibration; under the GEMM model the compute parameter is
// 1 / max_efficiency, and achieved_flops the average it gives the table's model.
Calibration calibration_from_fit(const Row& theta, int rows, TableCompute compute, const presets::GemmCurve& shape,
                                 const std::string& model) {
  constexpr double kNone = std::numeric_limits<double>::max();  // a parameter the data did not support
  Calibration c;
  c.achieved_flops = theta[0] > 0 ? 1 / theta[0] : kNone;
  c.combined = LinkFit{theta[1], theta[2] > 0 ? 1 / theta[2] : kNone, rows};
  c.optimizer_Bps = theta[3] > 0 ? 1 / theta[3] : kNone;
  if (compute == TableCompute::gemm) {
    c.gemm = shape;
    c.gemm.max_efficiency = theta[0] > 0 ? 1 / theta[0] : kNone;
    const TimingSetup& s = timing_setup(model);
    const double flops = presets::training_flops_per_token(s.spec, s.seq_len, presets::AttentionFlops::causal);
    c.achieved_flops = flops / table_compute_per_token(c, s).total(c.gemm);
  }
  return c;
}

}  // namespace

const TimingSetup& timing_setup(std::string_view model) {
  static const std::vector<TimingSetup> setups = {
      {"llama-500m", presets::find_model_preset("llama-500m", "").spec, 4096, 8, 1024,
       "mz687/SCAPE_SC26 slurm_scripts/vista (docs/PREDICTING.md, \"The artifact's setups\")"},
      {"llama-1.3b", presets::find_model_preset("llama-1.3b", "").spec, 2048, 8, 1024,
       "mz687/SCAPE_SC26 slurm_scripts/vista (docs/PREDICTING.md, \"The artifact's setups\")"},
      {"llama-1.8b", presets::find_model_preset("llama-1.8b", "").spec, 2048, 8, 1024,
       "mz687/SCAPE_SC26 slurm_scripts/vista (docs/PREDICTING.md, \"The artifact's setups\")"},
  };
  for (const auto& s : setups) {
    if (s.model == model) return s;
  }
  throw std::invalid_argument("unknown timing setup '" + std::string(model) + "' (llama-500m, llama-1.3b, llama-1.8b)");
}

OptimizerConfig table_optimizer(std::string_view method) {
  const std::string m(method);
  const bool known_step = std::find(std::begin(kStepMethods), std::end(kStepMethods), m) != std::end(kStepMethods);
  const bool known_memory =
      std::find(std::begin(kMemoryMethods), std::end(kMemoryMethods), m) != std::end(kMemoryMethods);
  if (!known_step && !known_memory) throw std::invalid_argument("unknown table method '" + m + "'");
  OptimizerConfig c;
  c.scape.formulation = Formulation::artifact;
  c.adams_form = AdamsForm::artifact;
  c.wire_dtype = WireType::fp32;   // --accumulate-allreduce-grads-in-fp32
  c.param_dtype = WireType::bf16;  // --bf16: the distributed optimizer gathers bf16 parameters
  c.mask_encoding = MaskEncoding::bitmap;
  const bool dense = m.rfind("adams", 0) == 0;
  c.type = dense ? OptimizerType::adams : OptimizerType::scape;
  c.sharded = m.find("_do") != std::string::npos;
  if (!dense) {
    const bool tenth = m.find("_0.1") != std::string::npos && m.find("_0.01") == std::string::npos;
    c.sparsity = tenth ? 0.9 : 0.99;
    // The scripts' offload flags: d = 0.1 offloads the residual in its plain and DO rows, and its
    // "CPUOffload" row offloads the parameter replica only; d = 0.01 offloads both in its
    // "CPUOffload" row and nothing otherwise. The memory rows say it in their names.
    const bool offload_row = m.find("offload") != std::string::npos;
    c.residual_offload = known_memory ? offload_row : (tenth ? !offload_row : offload_row);
  }
  c.validate();
  return c;
}

bool replica_offload(std::string_view method) {
  return method == "scape_0.1_do_offload" || method == "scape_0.01_do_offload" || method == "scape_do_offload";
}

ComputeSeconds table_compute_per_token(const Calibration& c, const TimingSetup& setup) {
  if (!c.gemm.fitted()) throw std::invalid_argument("table_compute_per_token: the calibration has no GEMM curve");
  const ComputeWork work = compute_work(setup.spec, setup.seq_len, setup.micro_batch);
  ComputeSeconds s = compute_seconds(work, c.gemm);
  s.gemm_at_full_efficiency /= work.tokens;
  s.elementwise /= work.tokens;
  return s;
}

presets::GemmCurve gh200_curve_shape() {
  presets::GemmCurve shape = presets::find_gpu_preset("gh200", "").gemm;
  shape.max_efficiency = 1.0;  // the one parameter the fit sets
  return shape;
}

StepInputs table_inputs(const Calibration& c, const TimingSetup& setup, const OptimizerConfig& optimizer) {
  const ParamLayout layout = tensor_layout(setup.spec);
  StepInputs in = calibrated_inputs(
      c, optimizer, layout.size(),
      presets::training_flops_per_token(setup.spec, setup.seq_len, presets::AttentionFlops::causal), 1.0);
  in.layout = layout;
  if (c.gemm.fitted()) in.compute_s_per_token = table_compute_per_token(c, setup).total(c.gemm);
  in.gpu.host_link_GBps = presets::find_gpu_preset("gh200", "").host_link_GBps;
  return in;
}

StepPrediction predict_table_row(const Calibration& c, const MeasuredRow& row) {
  const StepInputs in = table_inputs(c, timing_setup(row.model), table_optimizer(row.method));
  StepPrediction p = predict_step(in, row.gpus, tokens_per_gpu(row));
  if (replica_offload(row.method)) {
    // The fp32 replica of this GPU's shard goes to the host after the step and comes back
    // before the next one, unhidden.
    const double copy_s = 4.0 * static_cast<double>(Sharding(in.n_params, row.gpus).size(0)) / in.gpu.host_link_Bps();
    p.offload_s += 2 * copy_s;
    p.offload_exposed_s += 2 * copy_s;
    p.optimizer_s += 2 * copy_s;
    p.step_s += 2 * copy_s;
  }
  return p;
}

MemoryPrediction predict_memory(const MeasuredRow& row, int gpus) {
  const TimingSetup& s = timing_setup(row.model);
  const double n = static_cast<double>(presets::parameter_count(s.spec));
  const double sbh = static_cast<double>(s.seq_len) * s.micro_batch * s.spec.n_embd;
  const OptimizerConfig opt = table_optimizer(row.method);
  const bool scape = opt.type == OptimizerType::scape;
  MemoryPrediction m;
  m.weights = 2 * n;
  m.grads = 4 * n;
  m.state = 8 * n / (opt.sharded ? gpus : 1);
  m.residual = scape && !opt.residual_offload ? 4 * n : 0;
  m.replica = scape && opt.sharded ? 8 * n : 0;
  m.activations = 34 * sbh * s.spec.n_layer;
  m.logits = 6.0 * s.seq_len * s.micro_batch * static_cast<double>(s.spec.vocab_size);
  return m;
}

Calibration fit_step_table(const MeasuredTable& table, const std::vector<int>& leave_out, TableCompute compute,
                           const presets::GemmCurve& shape) {
  if (table.memory) throw std::invalid_argument(table.file.string() + ": a memory table has no step times to fit");
  std::vector<const MeasuredRow*> rows;
  for (const auto& r : table.rows) {
    if (std::find(leave_out.begin(), leave_out.end(), r.gpus) == leave_out.end()) rows.push_back(&r);
  }
  if (rows.size() < kParams) throw std::invalid_argument(table.file.string() + ": fewer than four rows to fit");
  Calibration current;  // the offload's exposure needs rates: none before the first pass
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<Row> a;
    for (const MeasuredRow* r : rows) {
      double fixed_s = 0;
      Row x = amounts(*r, fixed_s, current, compute, shape);
      const double target = r->value / 1e3 - fixed_s;  // seconds the four terms must explain
      for (double& v : x) v /= target;
      a.push_back(x);
    }
    current =
        calibration_from_fit(nonnegative_fit(a), static_cast<int>(rows.size()), compute, shape, rows.front()->model);
  }
  current.compute_samples = current.optimizer_samples = static_cast<int>(rows.size());
  current.sources.push_back(table.file.filename().string());
  return current;
}

nlohmann::json gemm_curve_json(const presets::GemmCurve& g) {
  return nlohmann::json{{"peak_TFLOPs", g.peak_TFLOPs},
                        {"ridge_flop_per_byte", g.ridge_flop_per_byte},
                        {"max_efficiency", g.max_efficiency},
                        {"memory_TBps", g.memory_TBps}};
}

namespace {

// The optional "gemm_curve" section; every field required, positive and finite, max_efficiency
// at most 1 (the peak is the datasheet's).
presets::GemmCurve read_gemm_curve(const nlohmann::json& j, const std::string& file) {
  const auto field = [&](const char* name) {
    if (!j.contains(name) || !j.at(name).is_number())
      throw std::invalid_argument(file + ": gemm_curve." + name + " must be a number");
    const double v = j.at(name).get<double>();
    if (!std::isfinite(v) || !(v > 0)) throw std::invalid_argument(file + ": gemm_curve." + name + " must be > 0");
    return v;
  };
  if (!j.is_object()) throw std::invalid_argument(file + ": gemm_curve must be an object");
  presets::GemmCurve g{field("peak_TFLOPs"), field("ridge_flop_per_byte"), field("max_efficiency"),
                       field("memory_TBps")};
  if (g.max_efficiency > 1) throw std::invalid_argument(file + ": gemm_curve.max_efficiency must be <= 1");
  return g;
}

}  // namespace

Calibration calibration_from_hardware(const nlohmann::json& hw, const std::string& file) {
  try {
    Calibration c;
    if (hw.contains("gemm_curve")) c.gemm = read_gemm_curve(hw.at("gemm_curve"), file);
    c.achieved_flops = hw.at("gpu").at("peak_TFLOPs").get<double>() * hw.at("gpu").value("mfu", 1.0) * 1e12;
    c.optimizer_Bps = hw.at("gpu").at("memory_bandwidth_TBps").get<double>() * 1e12;
    const auto& inter = hw.at("network").at("inter");
    c.combined = LinkFit{inter.at("alpha_us").get<double>() * 1e-6, inter.at("bandwidth_GBps").get<double>() * 1e9, 0};
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(file +
                                ": not a hardware description with gpu.peak_TFLOPs, "
                                "gpu.memory_bandwidth_TBps and network.inter: " +
                                e.what());
  }
}

}  // namespace scape::predict
