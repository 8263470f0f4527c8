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
#include "kernels/cpu/kernels.hpp"
#include "sim/emulated_comm.hpp"

namespace scape::train {
namespace detail {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

bool sparse(const OptimizerConfig& c) { return c.type == OptimizerType::scape || c.type == OptimizerType::topk_ef; }

// Scalar metric names, fixed for the whole run (a run file's columns).
std::vector<std::string> scalar_metric_names(const OptimizerConfig& c, bool measured) {
  std::vector<std::string> names = {"train_loss",      "lr",           "grad_norm",         "bytes_sent",
                                    "comm_time_model", "comm_time_exposed", "compute_time",  "step_time_model",
                                    "target_density",  "mask_density", "mask_jaccard",      "mask_oracle_overlap",
                                    "fill_in",         "residual_norm", "residual_max",     "residual_to_param",
                                    "staleness_mean",  "staleness_p99", "staleness_max",    "update_norm",
                                    "update_max",      "update_sign_flip", "nonfinite_grads", "optimizer_time",
                                    "aggregate_time",  "record_time"};
  for (const auto& p : collective_purposes(c)) names.push_back("bytes_sent_" + p);
  if (measured) {
    for (const auto& p : collective_purposes(c)) names.push_back("comm_time_measured_" + p);
    names.push_back("comm_time_measured_async_all_gather");
    names.push_back("mask_wait_exposed");
  }
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

  // Rank 0's time to combine the previous step's reports (oracle, gradient norm included) and
  // to write its row: a row's own cost is only known after it is written.
  double aggregate_s = 0;
  double record_s = 0;

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
        {"aggregate_time", aggregate_s},
        {"record_time", record_s},
    };
    for (const auto& r : m0.comm) v["bytes_sent_" + r.purpose] += r.bytes_sent_per_worker;
    // Measured times: the slowest worker sets the pace of a synchronous step.
    for (const auto* r : reports) {
      for (const auto& [purpose, seconds] : r->measured) {
        double& slot = v["comm_time_measured_" + purpose];
        slot = std::max(slot, seconds);
      }
      double& wait = v["mask_wait_exposed"];
      wait = std::max(wait, r->exposed_wait_s);
    }
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
  std::vector<StateMap> gather_states(int rank, const StateMap& mine) override {
    states_.resize(slots_.size());
    states_[static_cast<std::size_t>(rank)] = mine;
    comms_[rank]->barrier();
    return rank == 0 ? states_ : std::vector<StateMap>{};
  }
  void barrier(int rank) override { comms_[rank]->barrier(); }

 private:
  std::vector<const WorkerReport*> slots_;
  std::vector<StateMap> states_;
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

}  // namespace detail

using namespace detail;

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::completed: return "completed";
    case RunStatus::diverged: return "diverged";
    case RunStatus::failed: return "failed";
  }
  return "failed";
}

RunLog::RunLog(const experiments::ExperimentConfig& config, const ParamLayout& layout, const RunOptions& options,
               int resume_step)
    : config_(config), options_(options), layout_(layout) {
  const nlohmann::json resolved = config.to_json();
  id_ = experiments::run_id(resolved);
  experiments::RunFileSpec spec;
  spec.config_json = resolved.dump(2);
  spec.scape_version = options.scape_version;
  spec.git_sha = options.git_sha;
  spec.metric_names = scalar_metric_names(config.optimizer, options.measured_comm);
  for (const auto& s : layout.slots()) spec.tensor_names.push_back(s.name);
  spec.tensor_metric_names = tensor_metric_names();
  spec.final_params_size = config.log.save_params ? layout.size() : 0;
  spec.flush_interval = config.log.flush_interval;
  metric_names_ = spec.metric_names;
  recorder_ = std::make_unique<experiments::RunRecorder>(
      options.resume ? experiments::RunRecorder::open_for_resume(options.out, spec, resume_step)
                     : experiments::RunRecorder::create(options.out, spec));
  outcome_.steps_completed = resume_step;
  outcome_.n_params = layout.size();
  const double tokens = config.has_data() ? static_cast<double>(config.workers) * config.data.batch_size *
                                                config.model.block_size
                                          : 0.0;
  progress_ = std::make_unique<Progress>(config.steps, tokens, options.quiet);
  aggregator_ = std::make_unique<Aggregator>(Aggregator{config, layout, metric_names_, {}, {}, {}, {}, {}});
}

RunLog::~RunLog() = default;

bool RunLog::record_step(int t, std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask,
                         GradientSource& source, std::span<const float> params) {
  std::lock_guard lock(mutex_);
  double loss = 0;
  const auto r0 = std::chrono::steady_clock::now();
  aggregator_->fill(reports, mask, loss);
  const auto r1 = std::chrono::steady_clock::now();
  recorder_->append_step(t, aggregator_->row, aggregator_->tensor_row);
  aggregator_->aggregate_s = std::chrono::duration<double>(r1 - r0).count();
  aggregator_->record_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r1).count();
  bool bad = !std::isfinite(reports[0]->metrics.update_norm);
  for (const auto* r : reports) bad = bad || report_diverged(*r, config_.model.type != "replay");
  outcome_.steps_completed = t;
  last_loss_ = loss;
  bytes_total_ += aggregator_->row[3];
  step_time_total_ += aggregator_->row[7];
  ++rows_;
  if (!std::isnan(reports[0]->metrics.mask_jaccard)) {
    jaccard_total_ += reports[0]->metrics.mask_jaccard;
    ++jaccard_count_;
  }
  if (bad) {
    diverged_ = true;
    return true;
  }
  if (config_.has_data() && (t % config_.eval.interval == 0 || t == config_.steps)) {
    last_val_ = source.validation_loss(params, config_.eval.batches);
    recorder_->append_eval(t, last_val_);
  }
  progress_->update(t, loss, last_val_, t == config_.steps);
  return false;
}

void RunLog::write_checkpoint(int t, const std::vector<StateMap>& states, std::span<const float> params) {
  std::lock_guard lock(mutex_);
  // Rows up to t reach the disk before the checkpoint that resumes after t.
  recorder_->flush();
  detail::write_checkpoint(checkpoint_path(options_.out), id_, t, states, params);
}

void RunLog::write_final_params(std::span<const float> params) {
  std::lock_guard lock(mutex_);
  if (!diverged_ && config_.log.save_params) recorder_->write_final_params(params);
}

RunOutcome RunLog::finish(const std::string& failure) {
  std::lock_guard lock(mutex_);
  if (!failure.empty()) {
    outcome_.status = RunStatus::failed;
    outcome_.error = failure;
    recorder_->set_status("failed", failure);
  } else if (diverged_) {
    outcome_.status = RunStatus::diverged;
    outcome_.error = "non-finite loss or gradient at step " + std::to_string(outcome_.steps_completed);
    recorder_->set_status("diverged", outcome_.error);
  } else {
    outcome_.status = RunStatus::completed;
    recorder_->set_status("completed", "");
    std::error_code ec;
    std::filesystem::remove(checkpoint_path(options_.out), ec);
  }
  outcome_.final_val_loss = last_val_;
  outcome_.final_train_loss = last_loss_;
  outcome_.bytes_per_step = rows_ ? bytes_total_ / rows_ : kNaN;
  outcome_.mean_mask_jaccard = jaccard_count_ ? jaccard_total_ / jaccard_count_ : kNaN;
  outcome_.step_time_model = rows_ ? step_time_total_ / rows_ : kNaN;
  return outcome_;
}

int RunLog::steps_completed() const { return outcome_.steps_completed; }

std::filesystem::path checkpoint_path(const std::filesystem::path& out) { return out.string() + ".ckpt"; }

Checkpoint load_checkpoint(const experiments::ExperimentConfig& config, const RunOptions& options, std::size_t n) {
  return read_checkpoint(checkpoint_path(options.out), experiments::run_id(config.to_json()), config.workers, n);
}

void train_rank(const experiments::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume) {
  const int rank = comm.rank();
  const ParamLayout& layout = data.layout();
  auto source = make_gradient_source(config, data, rank);
  auto opt = make_optimizer(config.optimizer, layout, comm, config.steps);
  const bool moved = config.optimizer.device != kernels::DeviceKind::cpu || config.optimizer.residual_offload;
  if (rank == 0 && moved && !options.quiet) std::fprintf(stderr, "optimizer: %s\n", opt->device_summary().c_str());
  std::vector<float> params(layout.size()), grads(layout.size()), acc;
  int first = 1;
  if (resume != nullptr) {
    params = resume->params;
    opt->load_state(resume->states[static_cast<std::size_t>(rank)]);
    first = resume->step + 1;
  } else {
    data.init_params(params);
  }
  const bool want_oracle = config.log.oracle && sparse(config.optimizer);
  for (int t = first; t <= config.steps; ++t) {
    if (options.before_step) options.before_step(rank, t);
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
    report.measured = comm.take_measured_times();
    report.exposed_wait_s = comm.take_exposed_wait();
    const bool stop = exchange.exchange(rank, report, [&](std::span<const WorkerReport* const> reports) {
      return log->record_step(t, reports, opt->mask(), *source, params);
    });
    if (stop) break;
    if (options.checkpoint_every > 0 && t % options.checkpoint_every == 0 && t < config.steps) {
      StateMap mine;
      opt->save_state(mine);
      const auto states = exchange.gather_states(rank, mine);
      if (rank == 0) log->write_checkpoint(t, states, params);
      exchange.barrier(rank);
    }
  }
  opt->finish();
  exchange.barrier(rank);
  if (rank == 0) log->write_final_params(params);
}

void require_optimizer_device(const experiments::ExperimentConfig& config) {
  if (config.optimizer.device != kernels::DeviceKind::cuda) return;
  if (!kernels::cuda_built()) {
    throw experiments::ConfigError("optimizer.device: cuda, but this scape was built without CUDA (no nvcc at configure time)");
  }
  if (kernels::cuda_device_count() == 0) {
    throw experiments::ConfigError("optimizer.device: cuda, but no CUDA device is visible on this machine");
  }
}

RunOutcome run_simulated(const experiments::ExperimentConfig& config, const RunOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  require_optimizer_device(config);  // ConfigError: nothing written
  const std::unique_ptr<SourceData> data = load_source_data(config);  // ConfigError: nothing written
  Checkpoint checkpoint;
  if (options.resume) checkpoint = load_checkpoint(config, options, data->layout().size());
  RunLog log(config, data->layout(), options, checkpoint.step);
  std::vector<Communicator*> comms(static_cast<std::size_t>(config.workers), nullptr);
  SimExchange exchange(config.workers, comms.data());
  std::string failure;
  try {
    sim::run_ranks(config.workers, config.network.model(), [&](Communicator& comm) {
      comms[static_cast<std::size_t>(comm.rank())] = &comm;
      comm.barrier();  // every rank has registered its communicator
      train_rank(config, *data, options, comm, exchange, comm.rank() == 0 ? &log : nullptr,
                 options.resume ? &checkpoint : nullptr);
    });
  } catch (const std::exception& e) {
    failure = "step " + std::to_string(log.steps_completed() + 1) + ": " + e.what();
  }
  RunOutcome outcome = log.finish(failure);
  outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return outcome;
}

}  // namespace scape::train
