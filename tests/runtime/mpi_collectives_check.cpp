// Run under mpirun -np W: MpiComm passes the conformance cases (comm_conformance.hpp).
// Deterministic mode (an all-to-all, then the simulator's rank-order mean) must match bit for
// bit; MPI's own reductions may sum in another order, so the default mode is checked to a
// relative 1e-6 (W <= 4 fp32 additions of O(1) values: a few ulps).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include "runtime/mpi_comm.hpp"
#include "tests/runtime/comm_conformance.hpp"

using namespace scape;

namespace {

void check_all(bool deterministic) {
  runtime::MpiOptions options;
  options.deterministic = deterministic;
  runtime::MpiComm comm(MPI_COMM_WORLD, conformance::kNetwork, options);
  conformance::HostMemory memory;
  conformance::run_cases(
      comm, deterministic ? conformance::MeanMatch::bit_identical : conformance::MeanMatch::relative_1e6, memory);
}

}  // namespace

TEST_CASE("MpiComm deterministic mode is bit-identical to the simulator's reductions") { check_all(true); }
TEST_CASE("MpiComm default mode (MPI's reductions) agrees to rounding") { check_all(false); }

// The blocking time a rank's optimizer phase spent in collectives is the synchronous purposes'
// measured times alone: the lagged all-gather ran on the communication thread beside the caller.
TEST_CASE("MpiComm: take_blocking_seconds sums the synchronous collectives and leaves out the asynchronous one") {
  runtime::MpiComm comm(MPI_COMM_WORLD, conformance::kNetwork, runtime::MpiOptions{});
  (void)comm.take_measured_times();
  (void)comm.take_blocking_seconds();
  const auto w = static_cast<std::size_t>(comm.size());
  std::vector<float> data(1000, 1.0f);
  comm.all_reduce_mean(data, WireType::fp32, "grad_all_reduce");
  std::vector<float> send(w * 10, 2.0f), recv(10);
  const std::vector<std::size_t> counts(w, 10);
  comm.reduce_scatter_mean(send, recv, counts, WireType::fp32, "grad_reduce_scatter");
  std::vector<std::uint64_t> words(4, 7), gathered(4 * w);
  const std::vector<std::size_t> word_counts(w, 4);
  auto pending = comm.all_gather_words_async(words, gathered, word_counts, "mask_all_gather");
  pending.wait();
  const auto measured = comm.take_measured_times();
  const double blocking = comm.take_blocking_seconds();
  REQUIRE(measured.count("grad_all_reduce") == 1);
  REQUIRE(measured.count("grad_reduce_scatter") == 1);
  REQUIRE(measured.count("async_all_gather") == 1);
  CHECK(measured.at("async_all_gather") > 0);
  CHECK(blocking == measured.at("grad_all_reduce") + measured.at("grad_reduce_scatter"));
  CHECK(comm.take_blocking_seconds() == 0);  // taken once
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  doctest::Context context(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) context.setOption("out", "/dev/null");
  int result = provided >= MPI_THREAD_MULTIPLE ? context.run() : 1;
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
