// Every collective of NcclComm against EmulatedComm doing the same calls on the same inputs
// (each process runs all W emulated ranks on threads and keeps its own rank's results), on
// managed memory (used in place) and on plain host memory (staged), with the equal-count fast
// paths and with the per-root grouped paths. Gathers must match bit for bit, the byte ledger
// record for record. Means: NCCL's ncclAvg scales by 1/W before summing in its own order, so
// for W > 1 they are checked to a relative 1e-6 (fp32: W <= 8 additions of O(1) values, a few
// ulps) or one bf16 ulp (bf16: the fp32 mean is rounded to bf16 again, and a last-bit
// difference can move it across a rounding boundary); at W = 1 they must be exact.
//
// Built twice from this file (tests/CMakeLists.txt):
//   nccl_collectives_check      W = 1 in one process (make_single_process_nccl_comm), no MPI;
//   nccl_collectives_check_mpi  (SCAPE_NCCL_CHECK_MPI) under mpirun -np W with W visible CUDA
//                               devices, one rank per device (make_nccl_comm).
// Either exits 77 (skipped) with fewer devices than ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#ifdef SCAPE_NCCL_CHECK_MPI
#include <mpi.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/stream.hpp"
#include "runtime/nccl_comm.hpp"
#ifdef SCAPE_NCCL_CHECK_MPI
#include "runtime/nccl_bootstrap.hpp"
#endif
#include "sim/emulated_comm.hpp"

using namespace scape;

namespace {

int g_rank = 0;
int g_size = 1;

float value(int rank, std::size_t j) { return static_cast<float>(rng::normal(static_cast<std::uint64_t>(rank) + 5, j)); }

// n elements of T on the host (std::vector semantics) or in CUDA managed memory.
template <typename T>
class Array {
 public:
  Array(std::size_t n, bool managed) : n_(n), managed_(managed) {
    if (managed_) {
      void* p = nullptr;
      SCAPE_CUDA_CHECK(cudaMallocManaged(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
      p_ = static_cast<T*>(p);
    } else {
      host_.resize(std::max<std::size_t>(n, 1));
      p_ = host_.data();
    }
    for (std::size_t j = 0; j < n_; ++j) p_[j] = T{};
  }
  ~Array() {
    if (managed_) (void)cudaFree(p_);
  }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  std::span<T> span() { return {p_, n_}; }
  T& operator[](std::size_t j) { return p_[j]; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  bool managed_;
  T* p_ = nullptr;
  std::vector<T> host_;
};

struct Result {
  std::string name;
  bool reduction = false;  // a mean (checked to rounding) rather than moved bytes (exact)
  WireType wire = WireType::fp32;
  std::vector<float> floats;
  std::vector<std::byte> bytes;
};

struct Outputs {
  std::vector<Result> results;
  std::vector<CommRecord> records;
};

template <typename T>
std::vector<std::byte> bytes_of(Array<T>& a) {
  std::vector<std::byte> out(a.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), &a[0], out.size());
  return out;
}

template <typename T>
std::vector<float> floats_of(Array<T>& a) {
  return std::vector<float>(a.span().begin(), a.span().end());
}

std::size_t offset_of(const std::vector<std::size_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, std::size_t{0});
}

std::size_t sum_of(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// The same calls on any communicator; `managed` puts every buffer in CUDA managed memory.
Outputs exercise(Communicator& comm, bool managed) {
  const int w = comm.size();
  const int me = comm.rank();
  const std::size_t r = static_cast<std::size_t>(me);
  Outputs out;
  std::vector<std::size_t> uneven(static_cast<std::size_t>(w)), equal(static_cast<std::size_t>(w), 64),
      with_zero(static_cast<std::size_t>(w)), byte_counts(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) {
    const auto i = static_cast<std::size_t>(q);
    uneven[i] = static_cast<std::size_t>(3 * q + (q % 2 ? 0 : 5));
    with_zero[i] = q == 1 ? 0 : 9;
    byte_counts[i] = static_cast<std::size_t>(7 * q + 3);
  }

  for (WireType wire : {WireType::fp32, WireType::bf16}) {
    const std::size_t n = 1037;
    Array<float> data(n, managed);
    for (std::size_t j = 0; j < n; ++j) data[j] = value(me, j);
    comm.all_reduce_mean(data.span(), wire, "ar");
    out.results.push_back({std::string("all_reduce_mean ") + to_string(wire), true, wire, floats_of(data), {}});
  }
  for (WireType wire : {WireType::fp32, WireType::bf16}) {
    for (const auto* counts : {&uneven, &equal}) {
      const std::size_t total = sum_of(*counts);
      Array<float> send(total, managed), recv((*counts)[r], managed);
      for (std::size_t j = 0; j < total; ++j) send[j] = value(me, 100 + j);
      comm.reduce_scatter_mean(send.span(), recv.span(), *counts, wire, "rs");
      out.results.push_back({std::string("reduce_scatter_mean ") + to_string(wire) + (counts == &equal ? " equal" : " uneven"),
                             true, wire, floats_of(recv), {}});
    }
  }
  for (WireType wire : {WireType::fp32, WireType::bf16}) {
    for (const auto* counts : {&uneven, &equal, &with_zero}) {
      Array<float> mine((*counts)[r], managed), all(sum_of(*counts), managed);
      for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = value(me, 5000 + j);
      comm.all_gather(mine.span(), all.span(), *counts, wire, "ag");
      out.results.push_back({std::string("all_gather ") + to_string(wire), false, wire, {}, bytes_of(all)});
    }
  }
  {
    // In place, as the dense optimizer gathers parameters: the send span is this rank's
    // segment of the receive buffer.
    Array<float> all(sum_of(uneven), managed);
    const std::size_t off = offset_of(uneven, me);
    for (std::size_t j = 0; j < uneven[r]; ++j) all[off + j] = value(me, 7000 + j);
    comm.all_gather(all.span().subspan(off, uneven[r]), all.span(), uneven, WireType::fp32, "ag_in_place");
    out.results.push_back({"all_gather in place", false, WireType::fp32, {}, bytes_of(all)});
  }
  for (const auto* counts : {&uneven, &equal}) {
    Array<std::uint64_t> words((*counts)[r], managed), gathered(sum_of(*counts), managed),
        lagged(sum_of(*counts), managed);
    for (std::size_t j = 0; j < words.size(); ++j) words[j] = 0xabc0000000000000ull + (r << 20) + j;
    comm.all_gather_words(words.span(), gathered.span(), *counts, "words");
    auto pending = comm.all_gather_words_async(words.span(), lagged.span(), *counts, "lagged");
    pending.wait();
    out.results.push_back({"all_gather_words", false, WireType::fp32, {}, bytes_of(gathered)});
    out.results.push_back({"all_gather_words_async", false, WireType::fp32, {}, bytes_of(lagged)});
  }
  for (const auto* counts : {&byte_counts, &equal, &with_zero}) {
    Array<std::byte> mine((*counts)[r], managed), all(sum_of(*counts), managed), lagged(sum_of(*counts), managed);
    for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<std::byte>((r * 37 + j * 11) & 0xff);
    comm.all_gather_bytes(mine.span(), all.span(), *counts, "bytes");
    auto pending = comm.all_gather_bytes_async(mine.span(), lagged.span(), *counts, "bytes_lagged");
    pending.wait();
    out.results.push_back({"all_gather_bytes", false, WireType::fp32, {}, bytes_of(all)});
    out.results.push_back({"all_gather_bytes_async", false, WireType::fp32, {}, bytes_of(lagged)});
  }
  comm.barrier();
  out.records = comm.ledger().drain();
  return out;
}

// This process's rank of the same calls over W emulated ranks: the expectation.
Outputs emulated_expectation() {
  Outputs mine;
  std::mutex mutex;
  sim::run_ranks(g_size, NetworkModel{}, [&](Communicator& comm) {
    Outputs o = exercise(comm, false);
    if (comm.rank() == g_rank) {
      std::lock_guard lock(mutex);
      mine = std::move(o);
    }
  });
  return mine;
}

double bf16_ulp(float x) { return std::ldexp(1.0, std::ilogb(x == 0 ? 1.0f : x) - 7); }

void compare(const Outputs& got, const Outputs& want, const char* label) {
  CAPTURE(label);
  REQUIRE(got.results.size() == want.results.size());
  double worst = 0;
  std::size_t exact = 0, total = 0;
  for (std::size_t i = 0; i < got.results.size(); ++i) {
    const Result& g = got.results[i];
    const Result& e = want.results[i];
    CAPTURE(g.name);
    REQUIRE(g.name == e.name);
    CHECK(g.bytes == e.bytes);
    REQUIRE(g.floats.size() == e.floats.size());
    std::size_t bad = 0;
    for (std::size_t j = 0; j < g.floats.size(); ++j) {
      const float a = g.floats[j], b = e.floats[j];
      const double d = std::fabs(static_cast<double>(a) - b);
      worst = std::max(worst, d / (1.0 + std::fabs(b)));
      exact += a == b;
      ++total;
      if (g_size == 1) {
        bad += a != b;
      } else if (g.wire == WireType::bf16) {
        bad += d > bf16_ulp(b);
      } else {
        bad += d > 1e-6 * (1.0 + std::fabs(b));
      }
      // bf16 results must be bf16 values whatever the order of the sum.
      if (g.wire == WireType::bf16) bad += kernels::round_to_bf16(a) != a;
    }
    CHECK(bad == 0);
  }
  std::printf("rank %d %s: means bit-identical to the simulator for %zu of %zu values, max relative diff %.3g\n",
              g_rank, label, exact, total, worst);
  REQUIRE(got.records.size() == want.records.size());
  for (std::size_t i = 0; i < got.records.size(); ++i) {
    CAPTURE(i);
    CHECK(got.records[i].purpose == want.records[i].purpose);
    CHECK(got.records[i].kind == want.records[i].kind);
    CHECK(got.records[i].payload_bytes == want.records[i].payload_bytes);
    CHECK(got.records[i].bytes_sent_per_worker == want.records[i].bytes_sent_per_worker);
    CHECK(got.records[i].latency_steps == want.records[i].latency_steps);
    CHECK(got.records[i].modelled_time_s == want.records[i].modelled_time_s);
    CHECK(got.records[i].overlapped == want.records[i].overlapped);
  }
}

std::unique_ptr<runtime::NcclComm> g_comm;

}  // namespace

TEST_CASE("NcclComm: every collective against EmulatedComm, managed and host memory, fast and grouped paths") {
  const Outputs want = emulated_expectation();
  for (bool grouped : {false, true}) {
    g_comm->set_always_grouped(grouped);
    compare(exercise(*g_comm, true), want, grouped ? "managed memory, grouped calls" : "managed memory");
    compare(exercise(*g_comm, false), want, grouped ? "host memory, grouped calls" : "host memory");
  }
  g_comm->set_always_grouped(false);
  (void)g_comm->take_measured_times();
  (void)g_comm->take_exposed_wait();
}

TEST_CASE("NcclComm orders its work after the compute stream and times the asynchronous all-gather") {
  // The compute stream is still busy with a chain of large copies when each collective is
  // called; only after them does it write the values to send. The collectives gather into
  // separate buffers, so one that ran early would leave zeros there, whenever the host looks.
  cudaStream_t compute = nullptr;
  SCAPE_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  const kernels::cuda::StreamScope scope(compute);
  const std::size_t big = std::size_t{64} << 20, n = 4096, w = static_cast<std::size_t>(g_size);
  void* a = nullptr;
  void* b = nullptr;
  float* src = nullptr;
  SCAPE_CUDA_CHECK(cudaMalloc(&a, big));
  SCAPE_CUDA_CHECK(cudaMalloc(&b, big));
  SCAPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&src), n * sizeof(float)));
  Array<float> data(n, true), all(n * w, true);
  Array<std::uint64_t> words(n, true), gathered(n * w, true);
  for (std::size_t j = 0; j < n; ++j) src[j] = static_cast<float>(j + 1);
  auto keep_busy = [&] {
    for (int k = 0; k < 50; ++k) {
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, compute));
    }
  };
  const std::vector<std::size_t> counts(w, n);

  keep_busy();
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(&data[0], src, n * sizeof(float), cudaMemcpyHostToDevice, compute));
  g_comm->all_gather(data.span(), all.span(), counts, WireType::fp32, "ordered");
  std::size_t bad = 0;
  for (std::size_t j = 0; j < all.size(); ++j) bad += all[j] != static_cast<float>(j % n + 1);
  CHECK(bad == 0);

  keep_busy();
  SCAPE_CUDA_CHECK(cudaMemsetAsync(&words[0], 0x5a, n * sizeof(std::uint64_t), compute));
  auto pending = g_comm->all_gather_words_async(words.span(), gathered.span(), counts, "lagged");
  pending.wait();
  bad = 0;
  for (std::size_t j = 0; j < gathered.size(); ++j) bad += gathered[j] != 0x5a5a5a5a5a5a5a5aull;
  CHECK(bad == 0);
  const auto measured = g_comm->take_measured_times();
  REQUIRE(measured.count("async_all_gather") == 1);
  CHECK(measured.at("async_all_gather") > 0);
  CHECK(measured.count("ordered") == 1);
  CHECK(g_comm->take_exposed_wait() > 0);
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(compute));
  SCAPE_CUDA_CHECK(cudaFree(a));
  SCAPE_CUDA_CHECK(cudaFree(b));
  SCAPE_CUDA_CHECK(cudaFreeHost(src));
  SCAPE_CUDA_CHECK(cudaStreamDestroy(compute));
}

#ifdef SCAPE_NCCL_CHECK_MPI

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int devices = kernels::cuda::visible_device_count(), fewest = 0;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest < g_size) {
    if (g_rank == 0) {
      if (fewest == 0) {
        std::printf("no CUDA device visible: NCCL tests skipped\n");
      } else {
        std::printf("%d ranks need %d CUDA devices, %d visible: NCCL tests skipped\n", g_size, g_size, fewest);
      }
    }
    MPI_Finalize();
    return 77;
  }
  int result = 1;
  try {
    g_comm = runtime::make_nccl_comm(MPI_COMM_WORLD, NetworkModel{});
    std::printf("rank %d of %d: NCCL on device %d of %d\n", g_rank, g_size, g_comm->device(), devices);
    doctest::Context context(argc, argv);
    if (g_rank != 0) context.setOption("out", "/dev/null");
    result = provided >= MPI_THREAD_MULTIPLE ? context.run() : 1;
    g_comm.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    result = 1;
  }
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

#else

int main(int argc, char** argv) {
  const int devices = kernels::cuda::visible_device_count();
  if (devices == 0) {
    std::printf("no CUDA device visible: NCCL tests skipped\n");
    return 77;
  }
  int result = 1;
  try {
    g_comm = runtime::make_single_process_nccl_comm(NetworkModel{});
    std::printf("rank 0 of 1 (single process, no MPI): NCCL on device %d of %d\n", g_comm->device(), devices);
    doctest::Context context(argc, argv);
    result = context.run();
    g_comm.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    result = 1;
  }
  return result;
}

#endif
