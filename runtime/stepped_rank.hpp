// One rank of a multi-process run driven one step at a time by a caller that brings its own
// gradient and process group (the Python package's scape.torch.DistributedOptimizer under
// torchrun): a train::RankLoop of a model.type "external" run over a TransportComm, the report
// exchange over the same transport, and rank 0's run file as the MPI runtime writes it.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "experiments/config.hpp"
#include "runtime/transport_comm.hpp"
#include "train/gradient_source.hpp"
#include "train/rank_loop.hpp"
#include "train/run_log.hpp"

namespace scape::runtime {

class TransportExchange;

class SteppedRank {
 public:
  // Collective. config.workers must equal the transport's size and model.type be "external".
  // A setup failure on any rank (the run file, the optimizer) throws on every rank, naming the
  // rank; nothing is left half-written.
  SteppedRank(experiments::ExperimentConfig config, std::unique_ptr<train::ExternalData> data,
              train::RunOptions options, CollectiveTransport& transport, bool deterministic);
  ~SteppedRank();
  SteppedRank(const SteppedRank&) = delete;
  SteppedRank& operator=(const SteppedRank&) = delete;

  int rank() const { return transport_.rank(); }
  int steps_done() const { return steps_done_; }
  std::size_t size() const { return data_->layout().size(); }
  const ParamLayout& layout() const { return data_->layout(); }

  // Collective: this rank's gradient (size() values) and loss (NaN: none). Returns true when
  // rank 0 stopped the run (diverged). A failure here (this rank's, or a peer's seen as a
  // transport error) closes rank 0's run file as failed, naming the step, and is rethrown as
  // std::runtime_error.
  // compute_s: the seconds of this rank's forward and backward pass (NaN: unknown).
  bool step(std::span<const float> grads, double loss,
            double compute_s = std::numeric_limits<double>::quiet_NaN());
  std::span<const float> params() const { return loop_->params(); }
  std::span<const float> residual() const { return loop_->optimizer().residual(); }
  std::span<const std::uint64_t> mask() const { return loop_->optimizer().mask(); }
  // Rank 0's last row of the run file (empty on other ranks).
  std::vector<std::pair<std::string, double>> last_row() const;
  // Collective: ends the run (final parameters, status; failed when closed before config.steps,
  // or with `failure` when the caller gives one).
  const train::RunOutcome& close(const std::string& failure = {});
  // Not collective: ends this rank's part at once as failed (rank 0's run file says `failure`),
  // e.g. when the job is being terminated and no peer would join a collective.
  void abort(const std::string& failure);

 private:
  void fail(const std::string& failure);
  void release_log();

  experiments::ExperimentConfig config_;
  std::unique_ptr<train::ExternalData> data_;
  train::RunOptions options_;
  CollectiveTransport& transport_;
  std::unique_ptr<TransportComm> comm_;
  std::unique_ptr<TransportExchange> exchange_;
  std::unique_ptr<train::RunLog> log_;  // rank 0, until the run closes
  std::vector<std::pair<std::string, double>> last_row_;
  std::unique_ptr<train::RankLoop> loop_;
  int steps_done_ = 0;
  bool stopped_ = false;
  bool closed_ = false;
  train::RunOutcome outcome_;
};

}  // namespace scape::runtime
