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
