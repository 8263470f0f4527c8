// SteppedRank: setup with a collective error check, the report exchange over the transport,
// and the steps.
#include "runtime/stepped_rank.hpp"

#include <numeric>
#include <stdexcept>

#include "core/layout.hpp"
#include "train/checkpoint.hpp"
#include "train/run_metrics.hpp"

namespace scape::runtime {
namespace {

// Every rank's byte count, on every rank.
std::vector<std::size_t> all_lengths(CollectiveTransport& transport, std::size_t mine) {
  const auto w = static_cast<std::size_t>(transport.size());
  const std::uint64_t len = mine;
  std::vector<std::uint64_t> lens(w);
  transport.all_gather_bytes(std::as_bytes(std::span<const std::uint64_t>(&len, 1)),
                             std::as_writable_bytes(std::span<std::uint64_t>(lens)),
                             std::vector<std::size_t>(w, sizeof(std::uint64_t)));
  return {lens.begin(), lens.end()};
}

}  // namespace

// Reports travel as the metric table's values (train::ReportPacker) and the gradients (and a_i,
// m_prev) as floats, gathered onto rank 0 as the MPI runtime's exchange does. Not counted in
// the ledger: it moves metrics, not training traffic.
class TransportExchange final : public train::StepExchange {
 public:
  TransportExchange(CollectiveTransport& transport, const experiments::ExperimentConfig& config, std::size_t n,
                    std::size_t tensors)
      : transport_(transport), n_(n), packer_(config.optimizer, tensors), shards_(n, transport.size()) {
    with_moment_ = config.log.oracle && config.optimizer.type == OptimizerType::scape;
  }

  bool exchange(int rank, const train::WorkerReport& report,
                const std::function<bool(std::span<const train::WorkerReport* const>)>& decide) override {
    const auto w = static_cast<std::size_t>(transport_.size());
    const std::vector<double> mine = packer_.pack(report);
    const std::size_t width = mine.size();
    scalars_.resize(rank == 0 ? width * w : 0);
    gather(std::as_bytes(std::span<const double>(mine)), std::as_writable_bytes(std::span<double>(scalars_)),
           std::vector<std::size_t>(w, width * sizeof(double)));
    // Every rank takes the same steps' gradient metrics and oracle (the same config and step).
    const bool with_grads = !report.grads.empty();
    const bool with_acc = !report.accumulated.empty();
    const std::vector<std::size_t> whole(w, n_ * sizeof(float));
    if (with_grads) gather_floats(report.grads, grads_, rank, whole);
    if (with_acc) gather_floats(report.accumulated, acc_, rank, whole);
    if (with_acc && with_moment_) {
      std::vector<std::size_t> counts(w);
      for (std::size_t q = 0; q < w; ++q) counts[q] = shards_.size(static_cast<int>(q)) * sizeof(float);
      gather_floats(report.first_moment, moment_, rank, counts);
    }
    std::byte stop{0};
    if (rank == 0) {
      train::GatheredReports gathered{.scalars = scalars_, .width = width, .n = n_, .grads = {}, .accumulated = {}, .moment = {}};
      if (with_grads) gathered.grads = grads_;
      if (with_acc) gathered.accumulated = acc_;
      if (with_acc && with_moment_) gathered.moment = moment_;
      stop = decide(train::rebuild_reports(report, packer_, gathered, shards_, others_)) ? std::byte{1} : std::byte{0};
    }
    return broadcast_byte(stop) != std::byte{0};
  }

  std::vector<StateMap> gather_states(int rank, const StateMap& state) override {
    const auto w = static_cast<std::size_t>(transport_.size());
    const std::string bytes = train::encode_state_map(state);
    const std::vector<std::size_t> counts = all_lengths(transport_, bytes.size());
    std::vector<char> all(rank == 0 ? std::accumulate(counts.begin(), counts.end(), std::size_t{0}) : 0);
    gather(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())),
           std::as_writable_bytes(std::span<char>(all)), counts);
    std::vector<StateMap> out;
    std::size_t at = 0;
    for (std::size_t q = 0; rank == 0 && q < w; ++q) {
      out.push_back(train::decode_state_map(std::span<const char>(all.data() + at, counts[q])));
      at += counts[q];
    }
    return out;
  }

  void barrier(int) override { transport_.barrier(); }

 private:
  // Rank 0's byte, on every rank.
  std::byte broadcast_byte(std::byte mine) {
    const auto w = static_cast<std::size_t>(transport_.size());
    std::vector<std::byte> all(w);
    transport_.all_gather_bytes(std::span<const std::byte>(&mine, 1), all, std::vector<std::size_t>(w, 1));
    return all[0];
  }
  void gather(std::span<const std::byte> send, std::span<std::byte> recv, const std::vector<std::size_t>& counts) {
    gather_bytes(transport_, 0, send, recv, counts);
  }
  void gather_floats(std::span<const float> send, std::vector<float>& out, int rank,
                     const std::vector<std::size_t>& counts) {
    out.resize(rank == 0 ? std::accumulate(counts.begin(), counts.end(), std::size_t{0}) / sizeof(float) : 0);
    gather(std::as_bytes(send), std::as_writable_bytes(std::span<float>(out)), counts);
  }

  CollectiveTransport& transport_;
  std::size_t n_;
  train::ReportPacker packer_;
  Sharding shards_;
  bool with_moment_ = false;
  std::vector<double> scalars_;
  std::vector<float> grads_, acc_, moment_;
  std::vector<train::WorkerReport> others_;
};

namespace {

// Every rank's error text (empty where setup succeeded), joined; empty when all succeeded.
std::string all_errors(CollectiveTransport& transport, const std::string& mine) {
  const auto w = static_cast<std::size_t>(transport.size());
  const std::vector<std::size_t> counts = all_lengths(transport, mine.size());
  std::string text(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), '\0');
  transport.all_gather_bytes(std::as_bytes(std::span<const char>(mine.data(), mine.size())),
                             std::as_writable_bytes(std::span<char>(text.data(), text.size())), counts);
  std::string out;
  std::size_t at = 0;
  for (std::size_t q = 0; q < w; at += counts[q], ++q) {
    if (counts[q] == 0) continue;
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(q) + ": " + text.substr(at, counts[q]);
  }
  return out;
}

}  // namespace

SteppedRank::SteppedRank(experiments::ExperimentConfig config, std::unique_ptr<train::ExternalData> data,
                         train::RunOptions options, CollectiveTransport& transport, bool deterministic)
    : config_(std::move(config)), data_(std::move(data)), options_(std::move(options)), transport_(transport) {
  std::string error;
  try {
    if (config_.model.type != "external") {
      throw experiments::ConfigError("model.type: a stepped rank takes \"external\" gradients, got \"" +
                                     config_.model.type + "\"");
    }
    if (config_.workers != transport.size()) {
      throw experiments::ConfigError("workers: " + std::to_string(config_.workers) + ", but the process group has " +
                                     std::to_string(transport.size()) + " ranks");
    }
    comm_ = std::make_unique<TransportComm>(transport, config_.network.model(), deterministic);
    exchange_ = std::make_unique<TransportExchange>(transport, config_, data_->layout().size(),
                                                    data_->layout().slots().size());
    if (transport.rank() == 0) log_ = std::make_unique<train::RunLog>(config_, data_->layout(), options_, 0);
    loop_ = std::make_unique<train::RankLoop>(config_, *data_, options_, *comm_, *exchange_, log_.get(), nullptr,
                                              nullptr);
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "setup failed";
  }
  const std::string errors = all_errors(transport, error);
  if (!errors.empty()) {
    loop_.reset();
    if (log_) log_->finish("setup: " + errors);
    closed_ = true;
    throw std::runtime_error(errors);
  }
}

SteppedRank::~SteppedRank() = default;

void SteppedRank::fail(const std::string& failure) {
  stopped_ = true;
  closed_ = true;
  if (loop_) loop_->abandon();
  if (log_) outcome_ = log_->finish(failure);
  release_log();
  outcome_.status = train::RunStatus::failed;
  outcome_.error = failure;
}

bool SteppedRank::step(std::span<const float> grads, double loss, double compute_s) {
  train::require_next_step(closed_, "run", stopped_, steps_done_, config_.steps);
  if (grads.size() != size()) {
    throw std::invalid_argument("grads: " + std::to_string(grads.size()) + " values for a layout of " +
                                std::to_string(size()));
  }
  const int t = steps_done_ + 1;
  bool stop = false;
  try {
    stop = loop_->step(t, train::GivenGradient{grads, loss, compute_s});
  } catch (const std::exception& e) {
    fail("step " + std::to_string(t) + ": rank " + std::to_string(rank()) + ": " + e.what());
    throw std::runtime_error(outcome_.error);
  }
  steps_done_ = t;
  stopped_ = stop;
  return stop;
}

void SteppedRank::abort(const std::string& failure) {
  if (!closed_) fail(failure);
}

std::vector<std::pair<std::string, double>> SteppedRank::last_row() const {
  return log_ ? log_->last_row() : last_row_;
}

// The run file closes with the run, so another run may write the same path at once.
void SteppedRank::release_log() {
  if (!log_) return;
  last_row_ = log_->last_row();
  log_.reset();
}

const train::RunOutcome& SteppedRank::close(const std::string& caller_failure) {
  if (closed_) return outcome_;
  closed_ = true;
  std::string failure = train::closing_failure(caller_failure, steps_done_, config_.steps, stopped_);
  try {
    loop_->finish();
  } catch (const std::exception& e) {
    if (failure.empty()) failure = std::string("finish: rank ") + std::to_string(rank()) + ": " + e.what();
  }
  if (log_) outcome_ = log_->finish(failure);
  release_log();
  return outcome_;
}

}  // namespace scape::runtime
