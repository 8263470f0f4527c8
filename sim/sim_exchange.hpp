// The simulator's report exchange: reports stay in the workers' memory and rank 0 reads them
// between two barriers (train::StepExchange over W threads of one process).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "core/communicator.hpp"
#include "core/state.hpp"
#include "train/worker_report.hpp"

namespace scape::sim {

// Reports stay where the workers made them; rank 0 reads them between two barriers.
class SimExchange final : public train::StepExchange {
 public:
  SimExchange(int workers, Communicator* const* comms)
      : slots_(static_cast<std::size_t>(workers)), states_(static_cast<std::size_t>(workers)), comms_(comms) {}
  train::StepVerdict exchange(
      int rank, const train::WorkerReport& report,
      const std::function<train::StepVerdict(std::span<const train::WorkerReport* const>)>& decide) override {
    slots_[static_cast<std::size_t>(rank)] = &report;
    comms_[rank]->barrier();
    if (rank == 0) stop_ = decide(slots_);
    comms_[rank]->barrier();
    return stop_;
  }
  // Every rank writes only its own slot: the vector is sized once, in the constructor (a resize
  // from several ranks at once was a data race that ASan caught). The caller's barrier after
  // rank 0 writes the checkpoint keeps the next gather from overwriting slots rank 0 still reads.
  std::vector<StateMap> gather_states(int rank, const StateMap& mine) override {
    states_[static_cast<std::size_t>(rank)] = mine;
    comms_[rank]->barrier();
    return rank == 0 ? states_ : std::vector<StateMap>{};
  }
  void barrier(int rank) override { comms_[rank]->barrier(); }

 private:
  std::vector<const train::WorkerReport*> slots_;
  std::vector<StateMap> states_;
  Communicator* const* comms_;
  train::StepVerdict stop_ = train::StepVerdict::go_on;
};


}  // namespace scape::sim
