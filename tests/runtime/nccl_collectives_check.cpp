// NcclComm passes the conformance cases (comm_conformance.hpp) on managed memory (used in
// place) and on plain host memory (staged), with the equal-count fast paths and with the
// per-root grouped paths; then it orders its work after the compute stream. Gathers must match
// bit for bit, the byte ledger record for record. Means: NCCL's ncclAvg scales by 1/W before
// summing in its own order, so for W > 1 they are checked to a relative 1e-6 (fp32: W <= 8
// additions of O(1) values, a few ulps) or one bf16 ulp (bf16: the fp32 mean is rounded to bf16
// again, and a last-bit difference can move it across a rounding boundary); at W = 1 they must
// be exact.
//
// Built twice from this file (tests/runtime/CMakeLists.txt):
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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/stream.hpp"
#include "runtime/nccl_comm.hpp"
#ifdef SCAPE_NCCL_CHECK_MPI
#include "runtime/nccl_bootstrap.hpp"
#endif
#include "tests/runtime/comm_conformance.hpp"

using namespace scape;

namespace {

int g_rank = 0;
int g_size = 1;

// CUDA managed memory, which NcclComm uses in place.
class ManagedMemory final : public conformance::Memory {
 public:
  ~ManagedMemory() override { release_all(); }
  void* zeroed(std::size_t bytes) override {
    void* p = nullptr;
    SCAPE_CUDA_CHECK(cudaMallocManaged(&p, std::max<std::size_t>(bytes, 1)));
    std::memset(p, 0, bytes);
    blocks_.push_back(p);
    return p;
  }
  void release_all() override {
    for (void* p : blocks_) (void)cudaFree(p);
    blocks_.clear();
  }

 private:
  std::vector<void*> blocks_;
};

std::unique_ptr<runtime::NcclComm> g_comm;

}  // namespace

TEST_CASE("NcclComm: every conformance case, managed and host memory, fast and grouped paths") {
  // ncclAvg is exact at W = 1: scaling by 1 and a sum of one term (runtime/nccl_comm.hpp).
  const auto match =
      g_size == 1 ? conformance::MeanMatch::bit_identical : conformance::MeanMatch::relative_1e6_bf16_ulp;
  for (bool grouped : {false, true}) {
    g_comm->set_always_grouped(grouped);
    for (bool managed : {true, false}) {
      CAPTURE(grouped);
      CAPTURE(managed);
      ManagedMemory device_visible;
      conformance::HostMemory host;
      const auto stats =
          conformance::run_cases(*g_comm, match, managed ? static_cast<conformance::Memory&>(device_visible) : host);
      std::printf(
          "rank %d %s memory%s: means bit-identical to the reference for %zu of %zu values, max relative diff %.3g\n",
          g_rank, managed ? "managed" : "host", grouped ? ", grouped calls" : "", stats.bit_identical, stats.total,
          stats.worst_relative);
    }
  }
  g_comm->set_always_grouped(false);
  (void)g_comm->take_measured_times();
  (void)g_comm->take_exposed_wait(scape::CollectiveKind::all_gather);
}

TEST_CASE("NcclComm orders its work after the compute stream and times the asynchronous collectives") {
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
  ManagedMemory managed;
  const auto data = conformance::take<float>(managed, n), all = conformance::take<float>(managed, n * w);
  const auto words = conformance::take<std::uint64_t>(managed, n);
  const auto gathered = conformance::take<std::uint64_t>(managed, n * w);
  for (std::size_t j = 0; j < n; ++j) src[j] = static_cast<float>(j + 1);
  auto keep_busy = [&] {
    for (int k = 0; k < 50; ++k) {
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, compute));
    }
  };
  const std::vector<std::size_t> counts(w, n);

  keep_busy();
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(data.data(), src, n * sizeof(float), cudaMemcpyHostToDevice, compute));
  g_comm->all_gather(data, all, counts, WireType::fp32, "ordered");
  std::size_t bad = 0;
  for (std::size_t j = 0; j < all.size(); ++j) bad += all[j] != static_cast<float>(j % n + 1);
  CHECK(bad == 0);

  keep_busy();
  SCAPE_CUDA_CHECK(cudaMemsetAsync(words.data(), 0x5a, n * sizeof(std::uint64_t), compute));
  auto pending = g_comm->all_gather_words_async(words, gathered, counts, "lagged");
  pending.wait();
  bad = 0;
  for (std::size_t j = 0; j < gathered.size(); ++j) bad += gathered[j] != 0x5a5a5a5a5a5a5a5aull;
  CHECK(bad == 0);
  const auto measured = g_comm->take_measured_times();
  REQUIRE(measured.count("async_all_gather") == 1);
  CHECK(measured.at("async_all_gather") > 0);
  CHECK(measured.count("ordered") == 1);
  CHECK(g_comm->take_exposed_wait(scape::CollectiveKind::all_gather) > 0);

  // A gradient bucket (overlap_grad_reduce) is reduced after the backward kernels queued before
  // it: here the copy of the values, behind the busy chain. Every rank sends j + 1 at index j of
  // its W n values, so the mean of this rank's segment is its indices + 1.
  const auto bucket = conformance::take<float>(managed, n * w), reduced = conformance::take<float>(managed, n);
  keep_busy();
  for (std::size_t q = 0; q < w; ++q) {
    SCAPE_CUDA_CHECK(cudaMemcpyAsync(bucket.data() + q * n, src, n * sizeof(float), cudaMemcpyHostToDevice, compute));
  }
  auto pending_bucket = g_comm->reduce_scatter_mean_async(bucket, reduced, counts, "bucket");
  pending_bucket.wait();
  bad = 0;
  // ncclAvg scales before it sums: exact for W <= 2, within rounding beyond (nccl_comm.hpp).
  for (std::size_t j = 0; j < n; ++j) bad += std::fabs(reduced[j] - static_cast<float>(j + 1)) > 1e-6f * (j + 1);
  CHECK(bad == 0);
  const auto bucket_times = g_comm->take_measured_times();
  REQUIRE(bucket_times.count("async_reduce_scatter") == 1);
  CHECK(bucket_times.at("async_reduce_scatter") > 0);
  CHECK(g_comm->take_exposed_wait(scape::CollectiveKind::reduce_scatter) > 0);
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
    g_comm = runtime::make_nccl_comm(MPI_COMM_WORLD, conformance::kNetwork);
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
    g_comm = runtime::make_single_process_nccl_comm(conformance::kNetwork);
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
