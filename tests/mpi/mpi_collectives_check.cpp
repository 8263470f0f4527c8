// Run under mpirun -np W: every collective of MpiComm against the EmulatedComm algorithm on
// the same inputs (each rank can compute every rank's input). Deterministic mode must match
// bit for bit; MPI's own reductions may sum in another order, so the default mode is checked
// to a relative 1e-6 (W <= 4 fp32 additions of O(1) values: a few ulps).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cmath>
#include <numeric>

#include "core/rng.hpp"
#include "kernels/cpu/bf16.hpp"
#include "runtime/mpi_comm.hpp"

using namespace scape;

namespace {

float value(int rank, std::size_t j) { return static_cast<float>(rng::normal(static_cast<std::uint64_t>(rank) + 5, j)); }

float reference_mean(int w, std::size_t j, bool bf16) {
  float acc = 0;
  for (int r = 0; r < w; ++r) {
    const float x = bf16 ? kernels::round_to_bf16(value(r, j)) : value(r, j);
    acc = r == 0 ? x : acc + x;
  }
  const float m = acc / static_cast<float>(w);
  return bf16 ? kernels::round_to_bf16(m) : m;
}

bool close(float a, float b, bool exact) {
  if (exact) return a == b;
  return std::fabs(a - b) <= 1e-6f * (1.0f + std::fabs(b));
}

void check_all(bool deterministic) {
  runtime::MpiOptions options;
  options.deterministic = deterministic;
  runtime::MpiComm comm(MPI_COMM_WORLD, NetworkModel{}, options);
  const int w = comm.size();
  const std::size_t r = static_cast<std::size_t>(comm.rank());
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    const std::size_t n = 1037;
    std::vector<float> data(n);
    for (std::size_t j = 0; j < n; ++j) data[j] = value(comm.rank(), j);
    comm.all_reduce_mean(data, bf16 ? WireType::bf16 : WireType::fp32, "ar");
    std::size_t bad = 0;
    for (std::size_t j = 0; j < n; ++j) bad += !close(data[j], reference_mean(w, j, bf16), deterministic && true);
    CHECK(bad == 0);
  }
  std::vector<std::size_t> counts(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) counts[static_cast<std::size_t>(q)] = static_cast<std::size_t>(3 * q + (q % 2 ? 0 : 5));
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<float> send(total), recv(counts[r]);
  for (std::size_t j = 0; j < total; ++j) send[j] = value(comm.rank(), j);
  comm.reduce_scatter_mean(send, recv, counts, WireType::fp32, "rs");
  const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + comm.rank(), std::size_t{0});
  std::size_t bad = 0;
  for (std::size_t j = 0; j < recv.size(); ++j) bad += !close(recv[j], reference_mean(w, offset + j, false), deterministic);
  CHECK(bad == 0);
  std::vector<float> mine(counts[r]), all(total);
  for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<float>(r * 1000 + j);
  comm.all_gather(mine, all, counts, WireType::fp32, "ag");
  std::vector<std::uint64_t> words(counts[r], 0xabc0000000000000ull + r), gathered(total), async_gathered(total);
  comm.all_gather_words(words, gathered, counts, "words");
  auto pending = comm.all_gather_words_async(words, async_gathered, counts, "lagged");
  pending.wait();
  std::size_t pos = 0;
  bad = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    for (std::size_t j = 0; j < counts[q]; ++j, ++pos) {
      bad += all[pos] != static_cast<float>(q * 1000 + j);
      bad += gathered[pos] != 0xabc0000000000000ull + q;
      bad += async_gathered[pos] != 0xabc0000000000000ull + q;
    }
  }
  CHECK(bad == 0);
  // The ledger counts what the simulator counts.
  const auto records = comm.ledger().drain();
  REQUIRE(records.size() == 6);
  CHECK(records[0].payload_bytes == 1037 * 4);
  CHECK(records[1].payload_bytes == 1037 * 2);
  CHECK(records[2].payload_bytes == total * 4);
  CHECK(records[5].overlapped);
  CHECK(records[2].bytes_sent_per_worker == doctest::Approx((w - 1.0) / w * total * 4));
  comm.barrier();
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
