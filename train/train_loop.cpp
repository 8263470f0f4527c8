// Shared training loop and the in-process (simulated) runner. Aggregation rules across
// workers are documented in docs/run-files.md.
#include "train/train_loop.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <mutex>

#include "core/ledger.hpp"
#include "core/metrics.hpp"
#include "experiments/recorder.hpp"
#include "kernels/cpu/bitmask.hpp"
#include "kernels/cpu/select.hpp"
#include "sim/emulated_comm.hpp"

namespace scape::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

bool sparse(const OptimizerConfig& c) { return c.type == OptimizerType::scape || c.type == OptimizerType::topk_ef; }

// Scalar metric names, fixed for the whole run (a run file's columns).
std::vector<std::string> scalar_metric_names(const OptimizerConfig& c) {
  std::vector<std::string> names = {"train_loss",      "lr",           "grad_norm",         "bytes_sent",
                                    "comm_time_model", "comm_time_exposed", "compute_time",  "step_time_model",
                                    "target_density",  "mask_density", "mask_jaccard",      "mask_oracle_overlap",
                                    "fill_in",         "residual_norm", "residual_max",     "residual_to_param",
                                    "staleness_mean",  "staleness_p99", "staleness_max",    "update_norm",
                                    "update_max",      "update_sign_flip", "nonfinite_grads", "optimizer_time",
                                    "record_time"};
  for (const auto& p : collective_purposes(c)) names.push_back("bytes_sent_" + p);
  return names;
}

const std::vector<std::string>& tensor_metric_names() {
  static const std::vector<std::string> names = {"residual_norm", "mask_density", "mask_jaccard"};
  return names;
}

// Everything rank 0 needs to turn reports into a row.
struct Aggregator {
  const experiments::ExperimentConfig& config;
  const ParamLayout& layout;
  std::vector<std::string> metric_names;
  std::vector<double> row;
  std::vector<double> tensor_row;
  std::vector<float> mean_grad, mean_acc;
  std::vector<std::uint64_t> oracle_words;

  double record_s = 0;  // rank 0's time to combine and write the previous step's row

  void fill(std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask, double& loss_out) {
    const std::size_t w = reports.size();
    const StepMetrics& m0 = reports[0]->metrics;
    double loss = 0, residual = 0, residual_max = 0, ratio = 0, stale_mean = 0, stale_p99 = 0, stale_max = 0, compute = 0;
    double nonfinite = 0, optimizer = 0;
    for (const auto* r : reports) {
      optimizer += r->optimizer_s;
      loss += r->loss;
      residual += r->metrics.residual_norm;
      residual_max = std::max(residual_max, r->metrics.residual_max);
      ratio += r->metrics.residual_to_param;
      stale_mean += r->metrics.staleness_mean;
      stale_p99 = std::max(stale_p99, r->metrics.staleness_p99);
      stale_max = std::max(stale_max, r->metrics.staleness_max);
      compute += r->compute_s;
      nonfinite += static_cast<double>(r->metrics.nonfinite_grads);
    }
    const double wd = static_cast<double>(w);
    loss_out = loss / wd;
    if (!sparse(config.optimizer)) residual = residual_max = ratio = stale_mean = stale_p99 = stale_max = kNaN;
    const CommSummary comm = summarize(m0.comm);
    compute /= wd;
    // The lagged mask all-gather hides behind the next forward/backward; only its excess shows.
    const double step_time = compute + comm.exposed_time_s + std::max(0.0, comm.overlapped_time_s - compute);

    // Gradient of the global batch: mean over workers in rank order.
    mean_of(reports, [](const WorkerReport& r) { return r.grads; }, mean_grad);
    const double grad_norm = metrics::l2_norm(mean_grad);
    double oracle = kNaN;
    if (config.log.oracle && sparse(config.optimizer) && !reports[0]->accumulated.empty() && m0.k_total > 0) {
      mean_of(reports, [](const WorkerReport& r) { return r.accumulated; }, mean_acc);
      oracle_words.assign(kernels::words_for(mean_acc.size()), 0);
      kernels::topk_abs_mask(mean_acc, m0.k_total, oracle_words);
      oracle = static_cast<double>(kernels::popcount_and(mask, oracle_words)) / static_cast<double>(m0.k_total);
    }

    std::map<std::string, double> v = {
        {"train_loss", loss_out},
        {"lr", m0.lr},
        {"grad_norm", grad_norm},
        {"bytes_sent", comm.bytes_sent_per_worker},
        {"comm_time_model", comm.modelled_time_s},
        {"comm_time_exposed", comm.exposed_time_s},
        {"compute_time", compute},
        {"step_time_model", step_time},
        {"target_density", m0.target_density},
        {"mask_density", m0.mask_density},
        {"mask_jaccard", m0.mask_jaccard},
        {"mask_oracle_overlap", oracle},
        {"fill_in", m0.fill_in},
        {"residual_norm", residual / wd},
        {"residual_max", residual_max},
        {"residual_to_param", ratio / wd},
        {"staleness_mean", stale_mean / wd},
        {"staleness_p99", stale_p99},
        {"staleness_max", stale_max},
        {"update_norm", m0.update_norm},
        {"update_max", m0.update_max},
        {"update_sign_flip", m0.update_sign_flip},
        {"nonfinite_grads", nonfinite},
        {"optimizer_time", optimizer / wd},
        {"record_time", record_s},
    };
    for (const auto& r : m0.comm) v["bytes_sent_" + r.purpose] += r.bytes_sent_per_worker;
    row.assign(metric_names.size(), 0.0);
    for (std::size_t i = 0; i < metric_names.size(); ++i) {
      const auto it = v.find(metric_names[i]);
      row[i] = it == v.end() ? 0.0 : it->second;  // a purpose with no call this step sent 0 bytes
    }
    const std::size_t nt = layout.slots().size();
    tensor_row.assign(3 * nt, kNaN);
    for (std::size_t s = 0; s < nt; ++s) {
      if (!m0.tensor_residual_norm.empty()) {
        double sum = 0;
        for (const auto* r : reports) sum += r->metrics.tensor_residual_norm[s];
        tensor_row[s] = sum / wd;
      }
      if (!m0.tensor_mask_density.empty()) tensor_row[nt + s] = m0.tensor_mask_density[s];
      if (!m0.tensor_mask_jaccard.empty()) tensor_row[2 * nt + s] = m0.tensor_mask_jaccard[s];
    }
  }

  template <typename Get>
  static void mean_of(std::span<const WorkerReport* const> reports, Get get, std::vector<float>& out) {
    const auto first = get(*reports[0]);
    out.assign(first.begin(), first.end());
    for (std::size_t r = 1; r < reports.size(); ++r) {
      const auto x = get(*reports[r]);
      for (std::size_t j = 0; j < out.size(); ++j) out[j] += x[j];
    }
    const float w = static_cast<float>(reports.size());
    for (float& x : out) x /= w;
  }
};

class SimExchange final : public StepExchange {
 public:
  SimExchange(int workers, Communicator* const* comms) : slots_(static_cast<std::size_t>(workers)), comms_(comms) {}
  bool exchange(int rank, const WorkerReport& report,
                const std::function<bool(std::span<const WorkerReport* const>)>& decide) override {
    slots_[static_cast<std::size_t>(rank)] = &report;
    comms_[rank]->barrier();
    if (rank == 0) stop_ = decide(slots_);
    comms_[rank]->barrier();
    return stop_;
  }
  void barrier() override {}

 private:
  std::vector<const WorkerReport*> slots_;
  Communicator* const* comms_;
  bool stop_ = false;
};

// Progress line on stderr: at most every two seconds, and at the end.
class Progress {
 public:
  Progress(int total, double tokens_per_step, bool quiet) : total_(total), tokens_(tokens_per_step), quiet_(quiet) {}
  void update(int step, double loss, double val_loss, bool force) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::seconds(2)) return;
    if (steps_at_start_ < 0) steps_at_start_ = step - 1;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = (step - steps_at_start_) / std::max(elapsed, 1e-9);
    const double eta = (total_ - step) / std::max(rate, 1e-9);
    std::fprintf(stderr, "step %d/%d  loss %.4f", step, total_, loss);
    if (!std::isnan(val_loss)) std::fprintf(stderr, "  val %.4f", val_loss);
    if (tokens_ > 0) std::fprintf(stderr, "  %.0f tok/s", rate * tokens_);
    std::fprintf(stderr, "  %.2f steps/s  ETA %dm%02ds\n", rate, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  }

 private:
  int total_;
  double tokens_;
  bool quiet_;
  int steps_at_start_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

// Checkpoint: every rank's optimizer state and the (identical) parameters, written to a
// temporary file and renamed, so a crash never leaves a half-written checkpoint.
void write_checkpoint(const std::filesystem::path& path, const std::string& id, int step,
                      const std::vector<StateMap>& states, std::span<const float> params) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot write the checkpoint");
    auto put_u64 = [&](std::uint64_t x) { out.write(reinterpret_cast<const char*>(&x), sizeof x); };
    auto put_bytes = [&](const void* p, std::size_t n) {
      put_u64(n);
      out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    };
    out.write("SCAPECK1", 8);
    put_bytes(id.data(), id.size());
    put_u64(static_cast<std::uint64_t>(step));
    put_u64(states.size());
    for (const auto& state : states) {
      put_u64(state.size());
      for (const auto& [name, bytes] : state) {
        put_bytes(name.data(), name.size());
        put_bytes(bytes.data(), bytes.size());
      }
    }
    put_bytes(params.data(), params.size_bytes());
    if (!out) throw std::runtime_error(tmp + ": writing the checkpoint failed");
  }
  std::filesystem::rename(tmp, path);
}

struct Checkpoint {
  int step = 0;
  std::vector<StateMap> states;
  std::vector<float> params;
};

Checkpoint read_checkpoint(const std::filesystem::path& path, const std::string& id, int workers, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw experiments::ConfigError(path.string() + ": no checkpoint to resume from");
  auto corrupt = [&](const std::string& why) { return experiments::ConfigError(path.string() + ": corrupt checkpoint (" + why + ")"); };
  auto get_u64 = [&] {
    std::uint64_t x = 0;
    in.read(reinterpret_cast<char*>(&x), sizeof x);
    if (!in) throw corrupt("truncated");
    return x;
  };
  auto get_bytes = [&](std::size_t limit) {
    const std::uint64_t size = get_u64();
    if (size > limit) throw corrupt("entry larger than expected");
    std::vector<char> b(size);
    in.read(b.data(), static_cast<std::streamsize>(size));
    if (!in) throw corrupt("truncated");
    return b;
  };
  char magic[8];
  in.read(magic, 8);
  if (!in || std::string(magic, 8) != "SCAPECK1") throw corrupt("bad magic");
  const auto stored_id = get_bytes(64);
  if (std::string(stored_id.begin(), stored_id.end()) != id) {
    throw experiments::ConfigError(path.string() + ": the checkpoint belongs to another configuration (run id " +
                                   std::string(stored_id.begin(), stored_id.end()) + ", this config is " + id + ")");
  }
  Checkpoint c;
  c.step = static_cast<int>(get_u64());
  if (get_u64() != static_cast<std::uint64_t>(workers)) throw corrupt("worker count differs");
  const std::size_t limit = (n + 1024) * 16;
  c.states.resize(static_cast<std::size_t>(workers));
  for (auto& state : c.states) {
    const std::uint64_t entries = get_u64();
    for (std::uint64_t e = 0; e < entries; ++e) {
      const auto name = get_bytes(256);
      const auto bytes = get_bytes(limit);
      std::vector<std::byte>& dst = state[std::string(name.begin(), name.end())];
      dst.resize(bytes.size());
      if (!bytes.empty()) std::memcpy(dst.data(), bytes.data(), bytes.size());
    }
  }
  const auto p = get_bytes(n * sizeof(float));
  if (p.size() != n * sizeof(float)) throw corrupt("parameter count differs");
  c.params.resize(n);
  std::memcpy(c.params.data(), p.data(), p.size());
  return c;
}

// Replay traces carry no loss (NaN by design); every other source diverges on a non-finite loss.
bool report_diverged(const WorkerReport& r, bool has_loss) {
  return r.metrics.nonfinite_grads > 0 || (has_loss && !std::isfinite(r.loss));
}

}  // namespace

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::completed: return "completed";
    case RunStatus::diverged: return "diverged";
    case RunStatus::failed: return "failed";
  }
  return "failed";
}

RunOutcome run_simulated(const experiments::ExperimentConfig& config, const RunOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  const std::unique_ptr<SourceData> data = load_source_data(config);  // ConfigError: nothing written
  const ParamLayout& layout = data->layout();
  const nlohmann::json resolved = config.to_json();
  const std::string id = experiments::run_id(resolved);
  const std::filesystem::path checkpoint_path = options.out.string() + ".ckpt";
  Checkpoint checkpoint;
  if (options.resume) checkpoint = read_checkpoint(checkpoint_path, id, config.workers, layout.size());

  experiments::RunFileSpec spec;
  spec.config_json = resolved.dump(2);
  spec.scape_version = options.scape_version;
  spec.git_sha = options.git_sha;
  spec.metric_names = scalar_metric_names(config.optimizer);
  for (const auto& s : layout.slots()) spec.tensor_names.push_back(s.name);
  spec.tensor_metric_names = tensor_metric_names();
  spec.final_params_size = config.log.save_params ? layout.size() : 0;
  spec.flush_interval = config.log.flush_interval;
  auto recorder = options.resume ? experiments::RunRecorder::open_for_resume(options.out, spec, checkpoint.step)
                                 : experiments::RunRecorder::create(options.out, spec);

  RunOutcome outcome;
  outcome.steps_completed = checkpoint.step;
  outcome.n_params = layout.size();
  Aggregator agg{config, layout, spec.metric_names, {}, {}, {}, {}, {}};
  const double tokens_per_step = config.has_data() ? static_cast<double>(config.workers) * config.data.batch_size *
                                                         config.model.block_size
                                                   : 0.0;
  Progress progress(config.steps, tokens_per_step, options.quiet);
  double bytes_total = 0, jaccard_total = 0, step_time_total = 0;
  int jaccard_count = 0, rows = 0;
  double last_val = kNaN, last_loss = kNaN;
  bool diverged = false;
  std::vector<StateMap> saved_states(static_cast<std::size_t>(config.workers));
  std::vector<Communicator*> comms(static_cast<std::size_t>(config.workers), nullptr);
  SimExchange exchange(config.workers, comms.data());
  std::mutex error_mutex;

  try {
    sim::run_ranks(config.workers, config.network.model(), [&](Communicator& comm) {
      const int rank = comm.rank();
      comms[static_cast<std::size_t>(rank)] = &comm;
      comm.barrier();  // every rank has registered its communicator
      auto source = make_gradient_source(config, *data, rank);
      auto opt = make_optimizer(config.optimizer, layout, comm, config.steps);
      std::vector<float> params(layout.size()), grads(layout.size()), acc;
      if (options.resume) {
        params = checkpoint.params;
        opt->load_state(checkpoint.states[static_cast<std::size_t>(rank)]);
      } else {
        data->init_params(params);
      }
      const bool want_oracle = config.log.oracle && sparse(config.optimizer);
      for (int t = checkpoint.step + 1; t <= config.steps; ++t) {
        WorkerReport report;
        const double c0 = thread_cpu_seconds();
        report.loss = source->gradient(params, t, grads);
        report.compute_s = thread_cpu_seconds() - c0;
        if (want_oracle) {
          const auto e = opt->residual();
          acc.resize(grads.size());
          for (std::size_t j = 0; j < grads.size(); ++j) acc[j] = e[j] + grads[j];
          report.accumulated = acc;
        }
        const double o0 = thread_cpu_seconds();
        report.metrics = opt->step(params, grads);
        report.optimizer_s = thread_cpu_seconds() - o0;
        report.grads = grads;
        const bool stop = exchange.exchange(rank, report, [&](std::span<const WorkerReport* const> reports) {
          double loss = 0;
          const auto r0 = std::chrono::steady_clock::now();
          agg.fill(reports, opt->mask(), loss);
          recorder.append_step(t, agg.row, agg.tensor_row);
          agg.record_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
          bool bad = false;
          for (const auto* r : reports) bad = bad || report_diverged(*r, config.model.type != "replay");
          bad = bad || !std::isfinite(reports[0]->metrics.update_norm);
          outcome.steps_completed = t;
          last_loss = loss;
          bytes_total += agg.row[3];
          step_time_total += agg.row[7];
          ++rows;
          if (!std::isnan(reports[0]->metrics.mask_jaccard)) {
            jaccard_total += reports[0]->metrics.mask_jaccard;
            ++jaccard_count;
          }
          if (bad) {
            diverged = true;
            return true;
          }
          const bool eval_now = config.has_data() && (t % config.eval.interval == 0 || t == config.steps);
          if (eval_now) {
            last_val = source->validation_loss(params, config.eval.batches);
            recorder.append_eval(t, last_val);
          }
          progress.update(t, loss, last_val, t == config.steps);
          return false;
        });
        if (stop) break;
        if (options.checkpoint_every > 0 && t % options.checkpoint_every == 0 && t < config.steps) {
          saved_states[static_cast<std::size_t>(rank)].clear();
          opt->save_state(saved_states[static_cast<std::size_t>(rank)]);
          comm.barrier();
          if (rank == 0) {
            // Rows up to t reach the disk before the checkpoint that resumes after t.
            recorder.flush();
            write_checkpoint(checkpoint_path, id, t, saved_states, params);
          }
          comm.barrier();
        }
      }
      opt->finish();
      comm.barrier();
      if (rank == 0 && !diverged && config.log.save_params) recorder.write_final_params(params);
    });
  } catch (const std::exception& e) {
    std::lock_guard lock(error_mutex);
    outcome.status = RunStatus::failed;
    outcome.error = std::string("step ") + std::to_string(outcome.steps_completed + 1) + ": " + e.what();
    recorder.set_status("failed", outcome.error);
    outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    return outcome;
  }
  if (diverged) {
    outcome.status = RunStatus::diverged;
    outcome.error = "non-finite loss or gradient at step " + std::to_string(outcome.steps_completed);
    recorder.set_status("diverged", outcome.error);
  } else {
    outcome.status = RunStatus::completed;
    recorder.set_status("completed", "");
    std::error_code ec;
    std::filesystem::remove(checkpoint_path, ec);
  }
  outcome.final_val_loss = last_val;
  outcome.final_train_loss = last_loss;
  outcome.bytes_per_step = rows ? bytes_total / rows : kNaN;
  outcome.mean_mask_jaccard = jaccard_count ? jaccard_total / jaccard_count : kNaN;
  outcome.step_time_model = rows ? step_time_total / rows : kNaN;
  outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return outcome;
}

}  // namespace scape::train
