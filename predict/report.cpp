// Printed table, HDF5 prediction file and CSV of a prediction (docs/PREDICTING.md, "Outputs").
#include "predict/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "run_file/hdf5.hpp"

namespace scape::predict {
namespace {


std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string thousands(std::uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The two configurations of every row, by name, in output order.
struct Side {
  const char* name;
  const OptimizerConfig& config;
  std::function<const StepPrediction&(const PredictionRow&)> step;
  std::function<double(const PredictionRow&)> speedup, efficiency, tokens_per_s;
  std::function<const OptimizerMemory&(const PredictionRow&)> memory;
};

std::vector<Side> sides(const Prediction& p) {
  return {
      {"optimizer", p.config.optimizer, [](const PredictionRow& r) -> const StepPrediction& { return r.optimizer; },
       [](const PredictionRow& r) { return r.speedup; }, [](const PredictionRow& r) { return r.efficiency; },
       [](const PredictionRow& r) { return r.tokens_per_s(); },
       [](const PredictionRow& r) -> const OptimizerMemory& { return r.optimizer_memory; }},
      {"baseline", p.config.baseline, [](const PredictionRow& r) -> const StepPrediction& { return r.baseline; },
       [](const PredictionRow&) { return 1.0; }, [](const PredictionRow& r) { return r.baseline_efficiency; },
       [](const PredictionRow& r) { return r.baseline_tokens_per_s(); },
       [](const PredictionRow& r) -> const OptimizerMemory& { return r.baseline_memory; }},
  };
}

// Purposes of both configurations in the order their collectives are issued.
std::vector<std::string> purposes(const Prediction& p) {
  std::vector<std::string> out;
  for (const auto& side : sides(p)) {
    for (const auto& row : p.rows) {
      for (const auto& c : side.step(row).collectives) {
        if (std::find(out.begin(), out.end(), c.record.purpose) == out.end()) out.push_back(c.record.purpose);
      }
    }
  }
  return out;
}

// All collectives of one purpose in a step, summed (a steady-state step has at most one).
std::optional<CollectiveTime> of_purpose(const StepPrediction& s, const std::string& purpose) {
  std::optional<CollectiveTime> out;
  for (const auto& c : s.collectives) {
    if (c.record.purpose != purpose) continue;
    if (!out) {
      out = c;
      continue;
    }
    out->record.payload_bytes += c.record.payload_bytes;
    out->record.bytes_sent_per_worker += c.record.bytes_sent_per_worker;
    out->buckets += c.buckets;
    out->time_s += c.time_s;
    out->exposed_s += c.exposed_s;
    out->intra_bytes += c.intra_bytes;
    out->inter_bytes += c.inter_bytes;
  }
  return out;
}

std::string describe(const OptimizerConfig& o) {
  std::string s = to_string(o.type);
  s += std::string(" (") + (o.sharded ? "sharded" : "replicated");
  if (o.type == OptimizerType::scape || o.type == OptimizerType::topk_ef || o.type == OptimizerType::randk_ef) {
    s += ", sparsity " + fmt("%g", o.sparsity);
  }
  if (o.type == OptimizerType::onebit_adam) {
    s +=
        ", freeze step " + std::to_string(o.onebit.freeze_step) + ", sign chunk " + std::to_string(o.onebit.sign_chunk);
  }
  if (o.type == OptimizerType::powersgd) s += ", rank " + std::to_string(o.powersgd.rank);
  if (o.type == OptimizerType::demo) {
    s += ", DCT chunk " + std::to_string(o.demo.chunk) + ", top " + std::to_string(o.demo.topk);
  }
  if (o.type == OptimizerType::scape) {
    s += std::string(", ") + to_string(o.scape.mask_partition) + " mask, lag " + std::to_string(o.scape.mask_lag) +
         ", " + to_string(o.scape.update) + " update, " + to_string(o.scape.second_moment);
  }
  return s + ", wire " + to_string(o.wire_dtype) + ", params " + to_string(o.param_dtype) + ")";
}

std::string link(const LinkSpec& l) {
  return (l.preset.empty() ? std::string("custom") : l.preset) + " (" + fmt("%g", l.alpha_us) + " us, " +
         fmt("%g", l.bandwidth_GBps) + " GB/s)";
}

}  // namespace

void print_header(std::ostream& out, const Prediction& p) {
  const auto& c = p.config;
  const auto& m = c.model;
  out << "prediction " << c.name << (c.description.empty() ? "" : ": " + c.description) << "\n";
  out << "model " << (c.model_preset.empty() ? "custom" : c.model_preset) << " (" << to_string(m.family) << ", "
      << m.n_layer << " layers, width " << m.n_embd << ", " << m.n_head << " heads, vocab " << m.vocab_size
      << "): N = " << thousands(p.n_params) << " parameters, " << fmt("%.3g", p.flops_per_token / 1e9)
      << " GFLOP per token (attention " << to_string(c.attention) << ")\n";
  out << "gpu " << (c.gpu.preset.empty() ? "custom" : c.gpu.preset) << ": " << fmt("%g", c.gpu.peak_TFLOPs)
      << " TFLOP/s bf16 at MFU " << fmt("%g", c.gpu.mfu) << ", memory " << fmt("%g", c.gpu.memory_TBps) << " TB/s\n";
  if (c.gemm_curve.fitted()) {
    out << "compute: per-GEMM on the " << c.gpu.preset << " curve (max efficiency "
        << fmt("%.4g", c.gemm_curve.max_efficiency) << " of " << fmt("%g", c.gemm_curve.peak_TFLOPs)
        << " TFLOP/s, ridge " << fmt("%.4g", c.gemm_curve.ridge_flop_per_byte) << " FLOP/byte), micro-batch "
        << c.batch.micro_sequences << " sequences; gpu.mfu and peak unused\n";
  }
  out << "network: " << c.gpus_per_node << " GPU(s) and " << c.nics_per_node << " port(s) per node; inter "
      << link(c.inter) << "; intra " << link(c.intra) << "\n";
  out << "batch: " << to_string(c.batch.scaling) << " scaling, sequence length " << c.batch.seq_len << ", "
      << (c.batch.scaling == Scaling::strong ? std::to_string(c.batch.global_sequences) + " sequences per step"
                                             : std::to_string(c.batch.per_gpu_sequences) + " sequences per GPU")
      << "\n";
  const auto on = [](bool b) { return b ? "on" : "off"; };
  out << "overlap: grad_reduce " << on(c.overlap.grad_reduce) << ", param_gather " << on(c.overlap.param_gather)
      << ", sparse_reduce " << on(c.overlap.sparse_reduce) << ", mask_gather " << on(c.overlap.mask_gather)
      << ", buckets " << fmt("%g", c.overlap.bucket_MB) << " MB\n";
  out << "optimizer: " << describe(c.optimizer) << "\nbaseline:  " << describe(c.baseline) << "\n";
}

namespace {


// One value per worker count, as a 1-D float64 dataset.
void write_column(const run_file::File& file, const std::string& name, const Prediction& p,
                  const std::function<double(const PredictionRow&)>& value_of) {
  std::vector<double> v;
  for (const auto& r : p.rows) v.push_back(value_of(r));
  const hsize_t n = v.size();
  file.create_dataset(name, H5T_IEEE_F64LE, run_file::DatasetShape{{n}, {}, {}, {}}).write<double>({0}, {n}, v);
}

void write_int64(const run_file::File& file, const std::string& name, const std::vector<std::int64_t>& v) {
  const hsize_t n = v.size();
  file.create_dataset(name, H5T_STD_I64LE, run_file::DatasetShape{{n}, {}, {}, {}}).write<std::int64_t>({0}, {n}, v);
}

// /optimizer or /baseline: the step breakdown and the derived figures.
void write_side(const run_file::File& file, const Prediction& p, const Side& side) {
  const std::string g = side.name;
  file.create_group(g).write_string_attribute("type", to_string(side.config.type));
  const std::pair<const char*, double (*)(const StepPrediction&)> fields[] = {
      {"tokens_per_gpu", [](const StepPrediction& s) { return s.tokens_per_gpu; }},
      {"forward_s", [](const StepPrediction& s) { return s.forward_s; }},
      {"backward_s", [](const StepPrediction& s) { return s.backward_s; }},
      {"compute_s", [](const StepPrediction& s) { return s.compute_s(); }},
      {"optimizer_s", [](const StepPrediction& s) { return s.optimizer_s; }},
      {"optimizer_bytes", [](const StepPrediction& s) { return s.optimizer_bytes; }},
      {"state_s", [](const StepPrediction& s) { return s.state_s; }},
      {"select_s", [](const StepPrediction& s) { return s.select_s; }},
      {"pack_s", [](const StepPrediction& s) { return s.pack_s; }},
      {"offload_exposed_s", [](const StepPrediction& s) { return s.offload_exposed_s; }},
      {"mask_codec_s", [](const StepPrediction& s) { return s.mask_codec_s; }},
      {"comm_s", [](const StepPrediction& s) { return s.comm_s; }},
      {"exposed_comm_s", [](const StepPrediction& s) { return s.exposed_comm_s; }},
      {"step_s", [](const StepPrediction& s) { return s.step_s; }},
  };
  // Not a structured binding: clang 14 (the fuzz preset) cannot capture one in a lambda.
  for (const auto& field : fields) {
    const auto get = field.second;
    write_column(file, g + "/" + field.first, p, [&](const PredictionRow& r) { return get(side.step(r)); });
  }
  write_column(file, g + "/tokens_per_s", p, side.tokens_per_s);
  write_column(file, g + "/speedup", p, side.speedup);
  write_column(file, g + "/efficiency", p, side.efficiency);
  write_column(file, g + "/optimizer_state_bytes", p,
               [&](const PredictionRow& r) { return side.memory(r).state_bytes; });
  write_column(file, g + "/optimizer_memory_bytes", p, [&](const PredictionRow& r) { return side.memory(r).bytes; });
}

// GiB in the printed table; a dash for a method without a count.
std::string gib(double bytes) {
  return std::isnan(bytes) ? std::string("–") : fmt("%.3f", bytes / (1024.0 * 1024.0 * 1024.0));
}

// <side>/collectives/<purpose>: the ledger's bytes and the network's times of one collective.
void write_collective(const run_file::File& file, const Prediction& p, const Side& side, const std::string& purpose) {
  const std::string base = std::string(side.name) + "/collectives/" + purpose;
  const CollectiveTime first = *of_purpose(side.step(p.rows.front()), purpose);
  auto group = file.create_group(base);
  group.write_string_attribute("kind", to_string(first.record.kind));
  group.write_string_attribute("window", to_string(first.window));
  const std::pair<const char*, double (*)(const CollectiveTime&)> fields[] = {
      {"payload_bytes", [](const CollectiveTime& c) { return static_cast<double>(c.record.payload_bytes); }},
      {"bytes_sent_per_worker", [](const CollectiveTime& c) { return c.record.bytes_sent_per_worker; }},
      {"intra_bytes_per_gpu", [](const CollectiveTime& c) { return c.intra_bytes; }},
      {"inter_bytes_per_gpu", [](const CollectiveTime& c) { return c.inter_bytes; }},
      {"buckets", [](const CollectiveTime& c) { return static_cast<double>(c.buckets); }},
      {"time_s", [](const CollectiveTime& c) { return c.time_s; }},
      {"exposed_s", [](const CollectiveTime& c) { return c.exposed_s; }},
  };
  for (const auto& field : fields) {
    const auto get = field.second;
    write_column(file, base + "/" + field.first, p,
                 [&](const PredictionRow& r) { return get(*of_purpose(side.step(r), purpose)); });
  }
}

}  // namespace

void print_prediction(std::ostream& out, const Prediction& p) {
  print_header(out, p);
  out << "collective columns: modelled time in ms, exposed part in parentheses\n\n";
  const auto names = purposes(p);
  out << "| W | config | compute ms | opt. step ms |";
  for (const auto& n : names) out << " " << n << " |";
  out << " exposed comm ms | step ms | tokens/s | speedup | efficiency | opt. state GiB | opt. memory GiB |\n"
         "|---|---|---|---|";
  for (std::size_t i = 0; i < names.size(); ++i) out << "---|";
  out << "---|---|---|---|---|---|---|\n";
  for (const auto& row : p.rows) {
    for (const auto& side : sides(p)) {
      const StepPrediction& s = side.step(row);
      out << "| " << row.workers << " | " << to_string(side.config.type) << " | " << fmt("%.2f", s.compute_s() * 1e3)
          << " | " << fmt("%.2f", s.optimizer_s * 1e3) << " |";
      for (const auto& n : names) {
        const auto c = of_purpose(s, n);
        out << " " << (c ? fmt("%.2f", c->time_s * 1e3) + " (" + fmt("%.2f", c->exposed_s * 1e3) + ")" : "") << " |";
      }
      out << " " << fmt("%.2f", s.exposed_comm_s * 1e3) << " | " << fmt("%.2f", s.step_s * 1e3) << " | "
          << fmt("%.4g", side.tokens_per_s(row)) << " | " << fmt("%.3f", side.speedup(row)) << " | "
          << fmt("%.3f", side.efficiency(row)) << " | " << gib(side.memory(row).state_bytes) << " | "
          << gib(side.memory(row).bytes) << " |\n";
    }
  }
}

void write_prediction_hdf5(const std::filesystem::path& path, const Prediction& p) {
  auto file = run_file::File::create(path);
  file.write_string_attribute("format", "scape-prediction-1");
  file.write_string_attribute("config", p.config.to_json().dump());
  std::vector<std::int64_t> workers;
  for (const auto& r : p.rows) workers.push_back(r.workers);
  write_int64(file, "workers", workers);
  write_int64(file, "model/n_params", {static_cast<std::int64_t>(p.n_params)});
  const std::vector<double> flops{p.flops_per_token};
  file.create_dataset("model/flops_per_token", H5T_IEEE_F64LE, run_file::DatasetShape{{1}, {}, {}, {}})
      .write<double>({0}, {1}, flops);
  write_column(file, "global_tokens", p, [](const PredictionRow& r) { return r.global_tokens; });
  for (const auto& side : sides(p)) {
    write_side(file, p, side);
    for (const auto& purpose : purposes(p)) {
      if (of_purpose(side.step(p.rows.front()), purpose)) write_collective(file, p, side, purpose);
    }
  }
  file.close();
}

void write_prediction_csv(const std::filesystem::path& path, const Prediction& p) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error(path.string() + ": cannot open for writing");
  const auto names = purposes(p);
  out << "workers,config,type,tokens_per_gpu,global_tokens,compute_s,optimizer_s";
  for (const auto& n : names) out << "," << n << "_payload_bytes," << n << "_time_s," << n << "_exposed_s";
  out << ",comm_s,exposed_comm_s,step_s,tokens_per_s,speedup,efficiency,optimizer_state_bytes,optimizer_memory_bytes\n";
  const auto bytes = [](double v) { return std::isnan(v) ? std::string() : fmt("%.0f", v); };
  const auto num = [](double v) { return fmt("%.10g", v); };
  for (const auto& row : p.rows) {
    for (const auto& side : sides(p)) {
      const StepPrediction& s = side.step(row);
      out << row.workers << "," << side.name << "," << to_string(side.config.type) << "," << num(s.tokens_per_gpu)
          << "," << num(row.global_tokens) << "," << num(s.compute_s()) << "," << num(s.optimizer_s);
      for (const auto& n : names) {
        const auto c = of_purpose(s, n);
        if (c) {
          out << "," << c->record.payload_bytes << "," << num(c->time_s) << "," << num(c->exposed_s);
        } else {
          out << ",,,";
        }
      }
      out << "," << num(s.comm_s) << "," << num(s.exposed_comm_s) << "," << num(s.step_s) << ","
          << num(side.tokens_per_s(row)) << "," << num(side.speedup(row)) << "," << num(side.efficiency(row)) << ","
          << bytes(side.memory(row).state_bytes) << "," << bytes(side.memory(row).bytes) << "\n";
    }
  }
  out.flush();
  if (!out) throw std::runtime_error(path.string() + ": write failed");
}

}  // namespace scape::predict
