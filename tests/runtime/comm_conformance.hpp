// The communicator conformance suite: one table of collective calls that every Communicator
// backend must pass, with the expected results and ledger records computed here, once, from
// one input function, one rank-order reference mean and the ring closed forms of
// docs/algorithms.md ("Communication volume"). Three thin drivers run it:
//   test_comm.cpp               EmulatedComm, threads as ranks, W = 1..4 and 7;
//   mpi_collectives_check.cpp   MpiComm under mpirun -np 1..4, deterministic and default mode;
//   nccl_collectives_check.cpp  NcclComm (W = 1 in one process; W = 2 under mpirun), on CUDA
//                               managed and on host memory, fast and grouped paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/communicator.hpp"

namespace scape::conformance {

// Every driver builds its communicator on this network, so the modelled times are checked too.
inline constexpr NetworkModel kNetwork{1e-6, 1e9};

// Rank `rank`'s input at index i. Every rank can compute every rank's input, so each process
// knows the expected result without a second backend to compare with.
float value(int rank, std::size_t i);

// The mean every backend must reproduce: inputs rounded to the wire, summed left to right in
// rank order, divided by W, the result rounded to the wire again (core/communicator.hpp).
float reference_mean(int workers, std::size_t i, WireType wire);

enum class Collective {
  all_reduce_mean,
  reduce_scatter_mean,
  reduce_scatter_mean_async,  // in two buckets, both started before either is waited for
  all_gather,
  all_gather_in_place,  // the send span is this rank's segment of the receive buffer
  all_gather_words,
  all_gather_words_async,
  all_gather_bytes,
  all_gather_bytes_async,
  all_to_all_bytes,
};

// How many elements each rank contributes (all_reduce_mean: the length of every rank's data).
enum class Counts {
  long_vector,  // 1037 per rank: an all-reduce that is not a multiple of any chunk size
  equal,        // 64 per rank: the equal-count fast paths
  uneven,       // 3q + 5 for even ranks q, 3q for odd ones: the per-root (grouped) paths
  with_zero,    // rank 1 contributes nothing
  odd_bytes,    // 7q + 3: byte counts that are no multiple of a word
};
std::vector<std::size_t> counts_of(Counts counts, int workers);

struct CommCase {
  Collective collective;
  Counts counts;
  WireType wire;  // fp32 where the payload is words or bytes
};

// Every case, in the order the drivers run them.
std::span<const CommCase> cases();
// The case's name, also the purpose its ledger record carries.
std::string name_of(const CommCase& c);

// How closely means must match reference_mean. Gathers only move bytes: always exact.
enum class MeanMatch {
  bit_identical,  // EmulatedComm, MpiComm deterministic mode, NcclComm at W = 1
  relative_1e6,   // MPI's own reductions sum in another order: a few ulps of O(1) values
  // NCCL's ncclAvg scales by 1/W before summing: fp32 to 1e-6 relative, bf16 within one bf16
  // ulp (a last-bit difference of the fp32 mean can cross a bf16 rounding boundary).
  relative_1e6_bf16_ulp,
};

// Where a case's buffers live: host memory, or (NCCL driver) CUDA managed memory.
class Memory {
 public:
  virtual ~Memory() = default;
  // `bytes` zeroed bytes aligned for std::uint64_t, valid until release_all().
  virtual void* zeroed(std::size_t bytes) = 0;
  virtual void release_all() = 0;
};

// n values of T from `memory`.
template <typename T>
std::span<T> take(Memory& memory, std::size_t n) {
  return {static_cast<T*>(memory.zeroed(n * sizeof(T))), n};
}

class HostMemory final : public Memory {
 public:
  void* zeroed(std::size_t bytes) override;
  void release_all() override { blocks_.clear(); }

 private:
  std::vector<std::unique_ptr<std::uint64_t[]>> blocks_;
};

// How the means compared with reference_mean, for the drivers to print.
struct MeanStats {
  std::size_t bit_identical = 0;
  std::size_t total = 0;
  double worst_relative = 0;
};

// Runs every case on `comm` (a collective call: every rank of the group makes it) and checks
// each result and its ledger record. comm must be built on kNetwork with an empty ledger.
MeanStats run_cases(Communicator& comm, MeanMatch match, Memory& memory);

}  // namespace scape::conformance
