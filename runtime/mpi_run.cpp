// MPI runner (docs/runtime.md): setup with collective error checks, the report exchange,
// and the failure monitor / watchdog thread.
#include "runtime/mpi_run.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "runtime/mpi_check.hpp"
#include "train/run_metrics.hpp"
#include "train/run_session.hpp"
#include "train/stop_signal.hpp"

namespace scape::runtime {
namespace {

constexpr int kErrorTag = 77;

// Gathers every rank's error text on rank 0 ("" = fine); returns true on every rank when any failed.
bool any_failed(MPI_Comm world, const std::string& error, std::string& all_errors) {
  int failed = error.empty() ? 0 : 1, any = 0;
  SCAPE_MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, world));
  if (!any) return false;
  int rank = 0, size = 0;
  SCAPE_MPI_CHECK(MPI_Comm_rank(world, &rank));
  SCAPE_MPI_CHECK(MPI_Comm_size(world, &size));
  int len = static_cast<int>(error.size());
  std::vector<int> lens(static_cast<std::size_t>(size));
  SCAPE_MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world));
  std::vector<int> displs(static_cast<std::size_t>(size), 0);
  for (int q = 1; q < size; ++q)
    displs[static_cast<std::size_t>(q)] =
        displs[static_cast<std::size_t>(q - 1)] + lens[static_cast<std::size_t>(q - 1)];
  std::vector<char> text(static_cast<std::size_t>(displs.back() + lens.back()) + 1);
  SCAPE_MPI_CHECK(
      MPI_Gatherv(error.data(), len, MPI_CHAR, text.data(), lens.data(), displs.data(), MPI_CHAR, 0, world));
  if (rank == 0) {
    for (int q = 0; q < size; ++q) {
      if (lens[static_cast<std::size_t>(q)] == 0) continue;
      if (!all_errors.empty()) all_errors += '\n';
      all_errors += "rank " + std::to_string(q) + ": ";
      all_errors.append(text.data() + displs[static_cast<std::size_t>(q)],
                        static_cast<std::size_t>(lens[static_cast<std::size_t>(q)]));
    }
  }
  return true;
}

// Reports travel as the metric table's values (train::ReportPacker), the gradients (and a_i)
// as floats, optimizer states in the checkpoint's StateMap encoding.
class MpiExchange final : public train::StepExchange {
 public:
  MpiExchange(MPI_Comm world, const config::ExperimentConfig& config, std::size_t n, std::size_t tensors)
      : world_(world), n_(n), packer_(config.optimizer, tensors) {
    SCAPE_MPI_CHECK(MPI_Comm_size(world, &size_));
    with_moment_ = config.log.oracle && config.optimizer.type == OptimizerType::scape &&
                   train::has_oracle_metrics(config.optimizer);
    shards_ = Sharding(n, size_);
  }

  train::StepVerdict exchange(
      int rank, const train::WorkerReport& report,
      const std::function<train::StepVerdict(std::span<const train::WorkerReport* const>)>& decide) override {
    // Each rank's stop signal (train/stop_signal.hpp) travels as one more value after its report,
    // so that a signal that reached any rank stops every rank at the same step.
    std::vector<double> mine = packer_.pack(report);
    const std::size_t width = mine.size();
    mine.push_back(static_cast<double>(train::stop_signal()));
    const std::size_t w = static_cast<std::size_t>(size_);
    if (rank == 0) {
      scalars_.resize((width + 1) * w);
      grads_.resize(n_ * w);
    }
    SCAPE_MPI_CHECK(MPI_Gather(mine.data(), to_mpi_count(width + 1, "report"), MPI_DOUBLE, scalars_.data(),
                               to_mpi_count(width + 1, "report"), MPI_DOUBLE, 0, world_));
    if (rank == 0) take_stop_signals(width, w);
    // The diagnostics from here on: rank 0 has every report's scalars, so every rank has reached
    // this point and the time below is the gathers' own (the run file's diagnostics_time).
    const auto d0 = std::chrono::steady_clock::now();
    // Every rank takes the same steps' gradient metrics (log.gradient_metrics_interval).
    const bool with_grads = !report.grads.empty();
    if (with_grads) {
      SCAPE_MPI_CHECK(MPI_Gather(report.grads.data(), to_mpi_count(n_, "gradient gather"), MPI_FLOAT, grads_.data(),
                                 to_mpi_count(n_, "gradient gather"), MPI_FLOAT, 0, world_));
    }
    int with_acc = report.accumulated.empty() ? 0 : 1;
    SCAPE_MPI_CHECK(MPI_Bcast(&with_acc, 1, MPI_INT, 0, world_));
    if (with_acc) {
      if (rank == 0) acc_.resize(n_ * w);
      SCAPE_MPI_CHECK(MPI_Gather(report.accumulated.data(), to_mpi_count(n_, "oracle gather"), MPI_FLOAT, acc_.data(),
                                 to_mpi_count(n_, "oracle gather"), MPI_FLOAT, 0, world_));
      if (with_moment_) gather_moments(report);
    }
    int stop = 0;
    if (rank == 0) {
      train::GatheredReports gathered{
          .scalars = scalars_, .width = width, .n = n_, .grads = {}, .accumulated = {}, .moment = {}};
      if (with_grads) gathered.grads = grads_;
      if (with_acc) gathered.accumulated = acc_;
      if (with_acc && with_moment_) gathered.moment = moment_;
      // What the gathers above moved to rank 0, every rank's part counted (rank 0's own as
      // MPI_Gather's receive buffer holds it): its own purpose, apart from the optimizer's bytes.
      own_ = report;
      own_.diagnostic_bytes =
          static_cast<double>(sizeof(float)) *
          static_cast<double>(gathered.grads.size() + gathered.accumulated.size() + gathered.moment.size());
      own_.diagnostic_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
      stop = static_cast<int>(decide(train::rebuild_reports(own_, packer_, gathered, shards_, others_)));
    }
    SCAPE_MPI_CHECK(MPI_Bcast(&stop, 1, MPI_INT, 0, world_));
    return static_cast<train::StepVerdict>(stop);
  }

  std::vector<StateMap> gather_states(int rank, const StateMap& mine) override {
    const std::string bytes = train::encode_state_map(mine);
    long long len = static_cast<long long>(bytes.size());
    std::vector<long long> lens(static_cast<std::size_t>(size_));
    SCAPE_MPI_CHECK(MPI_Gather(&len, 1, MPI_LONG_LONG, lens.data(), 1, MPI_LONG_LONG, 0, world_));
    std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_), 0);
    std::vector<char> all;
    if (rank == 0) {
      for (int q = 0; q < size_; ++q)
        counts[static_cast<std::size_t>(q)] =
            to_mpi_count(static_cast<std::size_t>(lens[static_cast<std::size_t>(q)]), "checkpoint gather");
      for (int q = 1; q < size_; ++q)
        displs[static_cast<std::size_t>(q)] =
            displs[static_cast<std::size_t>(q - 1)] + counts[static_cast<std::size_t>(q - 1)];
      all.resize(static_cast<std::size_t>(displs.back() + counts.back()));
    }
    SCAPE_MPI_CHECK(MPI_Gatherv(bytes.data(), to_mpi_count(bytes.size(), "checkpoint gather"), MPI_CHAR, all.data(),
                                counts.data(), displs.data(), MPI_CHAR, 0, world_));
    std::vector<StateMap> out;
    if (rank == 0) {
      for (int q = 0; q < size_; ++q) {
        out.push_back(train::decode_state_map(
            std::span<const char>(all.data() + displs[static_cast<std::size_t>(q)],
                                  static_cast<std::size_t>(counts[static_cast<std::size_t>(q)]))));
      }
    }
    return out;
  }

  void barrier(int) override { SCAPE_MPI_CHECK(MPI_Barrier(world_)); }

 private:
  // Notes the first rank (in rank order) whose report carried a stop signal, and packs the
  // reports' values back to `width` apiece, as rebuild_reports reads them.
  void take_stop_signals(std::size_t width, std::size_t w) {
    for (std::size_t q = 0; q < w; ++q) {
      const int signal = static_cast<int>(scalars_[q * (width + 1) + width]);
      if (signal != 0) {
        train::note_stop_signal(signal, static_cast<int>(q));
        break;
      }
    }
    for (std::size_t q = 1; q < w; ++q)
      std::copy_n(scalars_.begin() + static_cast<std::ptrdiff_t>(q * (width + 1)), width,
                  scalars_.begin() + static_cast<std::ptrdiff_t>(q * width));
    scalars_.resize(width * w);
  }

  // Every owner's m_prev over its shard, into moment_ on rank 0 (shards are contiguous in rank
  // order, so the gathered vector is m_prev over [0, N)).
  void gather_moments(const train::WorkerReport& report) {
    std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
    for (int q = 0; q < size_; ++q) {
      counts[static_cast<std::size_t>(q)] = to_mpi_count(shards_.size(q), "first-moment gather");
      displs[static_cast<std::size_t>(q)] = to_mpi_count(shards_.begin(q), "first-moment gather");
    }
    moment_.resize(n_);
    SCAPE_MPI_CHECK(MPI_Gatherv(report.first_moment.data(),
                                to_mpi_count(report.first_moment.size(), "first-moment gather"), MPI_FLOAT,
                                moment_.data(), counts.data(), displs.data(), MPI_FLOAT, 0, world_));
  }

  MPI_Comm world_;
  int size_ = 1;
  std::size_t n_;
  train::ReportPacker packer_;
  std::vector<double> scalars_;
  std::vector<float> grads_, acc_, moment_;
  // SCAPE with the oracle: owners ship m_prev of their shard for the same-statistic oracle.
  bool with_moment_ = false;
  Sharding shards_{1, 1};
  std::vector<train::WorkerReport> others_;
  train::WorkerReport own_;  // rank 0's report with what its diagnostics sent
};

// Watches for this rank's failure (or a collective blocked past the timeout) and, on rank 0,
// for messages from failing ranks; then closes the run file and aborts every rank.
class FailureMonitor {
 public:
  FailureMonitor(MPI_Comm world, std::function<double()> blocked_for, Communicator& comm, train::RunLog* log,
                 double timeout_s)
      : blocked_for_(std::move(blocked_for)), comm_(comm), log_(log), timeout_s_(timeout_s) {
    SCAPE_MPI_CHECK(MPI_Comm_dup(world, &errors_));
    SCAPE_MPI_CHECK(MPI_Comm_rank(world, &rank_));
    thread_ = std::thread([this] { run(); });
  }
  ~FailureMonitor() {
    stop_ = true;
    thread_.join();
    MPI_Comm_free(&errors_);
  }

  void fail(const std::string& message) {
    std::lock_guard lock(mutex_);
    if (message_.empty()) message_ = message;
    failed_ = true;
  }

 private:
  void run() {
    while (!stop_) {
      if (blocked_for_() > timeout_s_) {
        fail("a collective has not completed after " + std::to_string(timeout_s_) +
             " s (watchdog; set --collective-timeout)");
      }
      if (failed_) handle_local_failure();
      if (rank_ == 0) poll_remote_failures();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  void handle_local_failure() {
    std::string message;
    {
      std::lock_guard lock(mutex_);
      message = message_;
    }
    comm_.abort();  // a collective stuck on a failed peer returns; nothing waits on the device
    if (rank_ == 0) abort_all("rank 0: " + message);
    MPI_Send(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, kErrorTag, errors_);
    // Rank 0 aborts the job; if it cannot (it is itself stuck), do it from here.
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::fprintf(stderr, "rank %d: %s\n", rank_, message.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  void poll_remote_failures() {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kErrorTag, errors_, &flag, &status);
    if (!flag) return;
    int len = 0;
    MPI_Get_count(&status, MPI_CHAR, &len);
    std::string message(static_cast<std::size_t>(len), '\0');
    MPI_Recv(message.data(), len, MPI_CHAR, status.MPI_SOURCE, kErrorTag, errors_, MPI_STATUS_IGNORE);
    abort_all("rank " + std::to_string(status.MPI_SOURCE) + ": " + message);
  }

  [[noreturn]] void abort_all(const std::string& message) {
    comm_.abort();
    std::fprintf(stderr, "error: %s\n", message.c_str());
    if (log_ != nullptr) {
      try {
        log_->finish(message);
        log_->close();  // MPI_Abort runs no destructor
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: could not close the run file: %s\n", e.what());
      }
    }
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

  std::function<double()> blocked_for_;
  Communicator& comm_;
  train::RunLog* log_;
  double timeout_s_;
  MPI_Comm errors_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::string message_;
  std::thread thread_;
};

// Tracks the step each rank is in, for error messages, and applies SCAPE_INJECT_FAILURE:
// "RANK:STEP" makes that rank throw before that step, "RANK:STEP:hang" makes it stop
// responding (tests of failure handling and of the watchdog).
void install_step_hook(train::RunOptions& options, std::atomic<int>& current_step) {
  int rank = -1, step = -1;
  char mode[8] = {0};
  const char* spec = std::getenv("SCAPE_INJECT_FAILURE");
  const int fields = spec ? std::sscanf(spec, "%d:%d:%7s", &rank, &step, mode) : 0;
  const bool hang = fields == 3 && std::string(mode) == "hang";
  if (fields < 2) rank = -1;
  options.before_step = [rank, step, hang, &current_step](int r, int t) {
    current_step = t;
    if (r != rank || t != step) return;
    if (hang) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    throw std::runtime_error("injected failure");
  };
}

}  // namespace

int run_mpi(const config::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi) {
  CommBackend backend;
  backend.make = [mpi](MPI_Comm world, const NetworkModel& net) -> std::unique_ptr<Communicator> {
    return std::make_unique<MpiComm>(world, net, mpi);
  };
  backend.blocked_for = [](const Communicator& c) { return static_cast<const MpiComm&>(c).blocked_for(); };
  return run_mpi(config, std::move(options), mpi, backend);
}

int run_mpi(const config::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi,
            const CommBackend& backend) {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 0;
  SCAPE_MPI_CHECK(MPI_Comm_rank(world, &rank));
  SCAPE_MPI_CHECK(MPI_Comm_size(world, &size));
  options.measured_comm = true;
  options.quiet = options.quiet || rank != 0;
  std::atomic<int> current_step{0};
  install_step_hook(options, current_step);

  // Setup, checked collectively: a bad data path on one rank stops every rank with exit 2.
  std::string error;
  std::unique_ptr<train::RunSession> session;
  if (size != config.workers) {
    error = "workers: the config asks for " + std::to_string(config.workers) + " workers but mpirun started " +
            std::to_string(size) + " ranks";
  } else {
    try {
      if (backend.check) backend.check();
      session = std::make_unique<train::RunSession>(config, options, train::DeviceUse{1, false});  // one GPU per rank
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::string all_errors;
  if (any_failed(world, error, all_errors)) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", all_errors.c_str());
    return 2;
  }
  // The communicator (NCCL's initialisation is collective; a failure there reaches every rank).
  std::unique_ptr<Communicator> comm;
  try {
    comm = backend.make(world, config.network.model());
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (any_failed(world, error, all_errors)) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", all_errors.c_str());
    return 1;
  }
  int open_code = 1;  // a refusal (another writer, another backend's file) is invalid input: 2
  if (rank == 0) {
    try {
      session->open_log();
    } catch (const config::ConfigError& e) {
      error = e.what();
      open_code = 2;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (any_failed(world, error, all_errors)) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", all_errors.c_str());
    SCAPE_MPI_CHECK(MPI_Bcast(&open_code, 1, MPI_INT, 0, world));
    return open_code;
  }

  int code = 0;
  {
    const ParamLayout& layout = session->data().layout();
    MpiExchange exchange(world, config, layout.size(), layout.slots().size());
    const Communicator& watched = *comm;
    auto blocked_for = [&backend, &watched] { return backend.blocked_for ? backend.blocked_for(watched) : 0.0; };
    FailureMonitor monitor(world, blocked_for, *comm, session->log(), mpi.collective_timeout_s);
    try {
      train::train_rank(config, session->data(), options, *comm, exchange, session->log(), session->resume());
    } catch (const std::exception& e) {
      monitor.fail("step " + std::to_string(current_step.load()) + ": " + e.what());
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the monitor aborts the job
    }
    if (rank == 0) {
      const train::RunOutcome outcome = session->finish("");
      code = outcome.status == train::RunStatus::completed     ? 0
             : outcome.status == train::RunStatus::diverged    ? 3
             : outcome.status == train::RunStatus::interrupted ? 128 + outcome.signal
                                                               : 1;
      // As the simulator's line: the wall time from setup on (the median step_wall_time times the
      // steps, plus the start-up: data, communicator, run file).
      const double wall_s = session->elapsed_s();
      std::fprintf(stderr, "%s: %s after %d/%d steps in %.1f s -> %s\n", config.name.c_str(),
                   train::to_string(outcome.status), outcome.steps_completed, config.steps, wall_s,
                   options.out.string().c_str());
      if (outcome.status == train::RunStatus::interrupted) std::fprintf(stderr, "  %s\n", outcome.error.c_str());
    }
    SCAPE_MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, world));
  }
  comm.reset();
  return code;
}

}  // namespace scape::runtime
