// Collective microbenchmark over any Communicator backend (`scape bench-comm`).
#include "runtime/bench_comm.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "run_file/bench_comm_file.hpp"
#include "runtime/mpi_check.hpp"
#include "runtime/mpi_comm.hpp"

namespace scape::runtime {
namespace {


// The collectives of the optimizers: float reductions and gathers (gradients, parameters,
// sparse payloads) and the 64-bit word gather of masks.
struct Collective {
  const char* name;
  CollectiveKind kind;
  std::size_t element_bytes;
};
constexpr Collective kCollectives[] = {
    {"all_reduce", CollectiveKind::all_reduce, sizeof(float)},
    {"reduce_scatter", CollectiveKind::reduce_scatter, sizeof(float)},
    {"all_gather", CollectiveKind::all_gather, sizeof(float)},
    {"all_gather_words", CollectiveKind::all_gather, sizeof(std::uint64_t)},
    {"all_to_all", CollectiveKind::all_to_all, sizeof(float)},  // 1-bit Adam's compressed exchange
};

// One call on `n` elements in total (a multiple of W).
void call(Communicator& comm, const Collective& c, void* send, void* recv, std::size_t n) {
  const std::size_t w = static_cast<std::size_t>(comm.size());
  const std::vector<std::size_t> counts(w, n / w);
  const std::string purpose = std::string("bench_") + c.name;
  if (c.element_bytes == sizeof(std::uint64_t)) {
    comm.all_gather_words({static_cast<const std::uint64_t*>(send), n / w}, {static_cast<std::uint64_t*>(recv), n},
                          counts, purpose);
    return;
  }
  float* s = static_cast<float*>(send);
  float* r = static_cast<float*>(recv);
  switch (c.kind) {
    case CollectiveKind::all_reduce: comm.all_reduce_mean({s, n}, WireType::fp32, purpose); break;
    case CollectiveKind::reduce_scatter:
      comm.reduce_scatter_mean({s, n}, {r, n / w}, counts, WireType::fp32, purpose);
      break;
    case CollectiveKind::all_gather: comm.all_gather({s, n / w}, {r, n}, counts, WireType::fp32, purpose); break;
    case CollectiveKind::all_to_all: {
      const std::vector<std::size_t> segment_bytes(w, n / w * sizeof(float));
      comm.all_to_all_bytes({reinterpret_cast<const std::byte*>(s), n * sizeof(float)},
                            {reinterpret_cast<std::byte*>(r), n * sizeof(float)}, segment_bytes, purpose);
      break;
    }
  }
}

std::string check_options(const BenchCommOptions& o) {
  if (o.min_bytes < 8 || o.max_bytes < o.min_bytes) return "--min-bytes must be >= 8 and <= --max-bytes";
  if (!(o.factor > 1)) return "--factor must be > 1";
  if (o.iters < 1 || o.warmup < 0) return "--iters must be >= 1 and --warmup >= 0";
  if (!(o.idle_gap_s >= 0) || !std::isfinite(o.idle_gap_s)) return "--idle-gap-ms must be >= 0";
  return "";
}

// The largest of the ranks' `seconds`; the communicator's own timings of the calls are dropped.
double slowest_rank(MPI_Comm world, Communicator& comm, double seconds) {
  double out = 0;
  SCAPE_MPI_CHECK(MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, world));
  comm.take_measured_times();
  return out;
}

// Seconds per call on the slowest rank.
double time_calls(MPI_Comm world, Communicator& comm, const Collective& c, void* send, void* recv, std::size_t n,
                  const BenchCommOptions& o) {
  for (int i = 0; i < o.warmup; ++i) call(comm, c, send, recv, n);
  SCAPE_MPI_CHECK(MPI_Barrier(world));
  const double t0 = MPI_Wtime();
  for (int i = 0; i < o.iters; ++i) call(comm, c, send, recv, n);
  return slowest_rank(world, comm, (MPI_Wtime() - t0) / o.iters);
}

// Seconds per call on the slowest rank, each call timed alone after the link idled for the gap.
double time_idle_calls(MPI_Comm world, Communicator& comm, const Collective& c, void* send, void* recv, std::size_t n,
                       const BenchCommOptions& o) {
  double mine = 0;
  for (int i = 0; i < o.iters; ++i) {
    SCAPE_MPI_CHECK(MPI_Barrier(world));
    std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_gap_s));
    const double t0 = MPI_Wtime();
    call(comm, c, send, recv, n);
    mine += MPI_Wtime() - t0;
  }
  return slowest_rank(world, comm, mine / o.iters);
}

}  // namespace

double bus_factor(CollectiveKind kind, int workers) {
  const double w = workers;
  return (kind == CollectiveKind::all_reduce ? 2.0 : 1.0) * (w - 1) / w;
}

BenchBackend mpi_bench_backend() {
  BenchBackend b;
  b.name = "mpi";
  b.make = [](MPI_Comm world) -> std::unique_ptr<Communicator> {
    return std::make_unique<MpiComm>(world, NetworkModel{}, MpiOptions{});
  };
  b.allocate = [](std::size_t bytes) { return std::calloc(bytes, 1); };
  b.release = [](void* p) { std::free(p); };
  return b;
}

int bench_comm(MPI_Comm world, const BenchBackend& backend, const BenchCommOptions& o) {
  int rank = 0, size = 0;
  SCAPE_MPI_CHECK(MPI_Comm_rank(world, &rank));
  SCAPE_MPI_CHECK(MPI_Comm_size(world, &size));
  if (const std::string error = check_options(o); !error.empty()) {
    if (rank == 0) std::fprintf(stderr, "error: bench-comm: %s\n", error.c_str());
    return 2;
  }
  const std::unique_ptr<Communicator> comm = backend.make(world);
  const std::size_t w = static_cast<std::size_t>(size);
  const std::size_t capacity = o.max_bytes + w * sizeof(std::uint64_t);
  void* send = backend.allocate(capacity);
  void* recv = backend.allocate(capacity);
  std::vector<run_file::BenchCommRow> rows;
  if (rank == 0) {
    std::printf("# scape bench-comm --backend %s, %d ranks, %d iterations (%d warm-up) per size; time of the slowest "
                "rank\n#%17s %14s %12s %12s %12s %12s\n", backend.name.c_str(), size, o.iters, o.warmup, "collective",
                "size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  }
  for (const bool idle : {false, true}) {
    if (idle && !(o.idle_gap_s > 0)) break;
    if (idle && rank == 0) std::printf("# each call after %.0f ms of idle link\n", o.idle_gap_s * 1e3);
    for (const Collective& c : kCollectives) {
      for (double bytes = static_cast<double>(o.min_bytes); bytes <= static_cast<double>(o.max_bytes) * (1 + 1e-9);
           bytes *= o.factor) {
        // A multiple of W elements, so that every rank has an equal share.
        const std::size_t n = std::max(w, static_cast<std::size_t>(bytes) / c.element_bytes / w * w);
        const double payload = static_cast<double>(n * c.element_bytes);
        const double t =
            idle ? time_idle_calls(world, *comm, c, send, recv, n, o) : time_calls(world, *comm, c, send, recv, n, o);
        const double algbw = payload / t / 1e9;
        rows.push_back(run_file::BenchCommRow{
            c.name, to_string(c.kind), idle ? "idle" : "busy", static_cast<double>(size), payload,
            static_cast<double>(ring_latency_steps(c.kind, size)), ring_bytes_sent_per_worker(c.kind, size, payload), t,
            algbw, algbw * bus_factor(c.kind, size)});
        if (rank == 0) {
          std::printf(" %17s %14.0f %12zu %12.2f %12.3f %12.3f\n", c.name, payload, n, t * 1e6, algbw,
                      rows.back().busbw_GBps);
          std::fflush(stdout);
        }
      }
    }
  }
  backend.release(send);
  backend.release(recv);
  int code = 0;
  if (rank == 0) {
    try {
      run_file::write_bench_comm_file(o.out, backend.name, rows);
      std::fprintf(stderr, "bench-comm: %zu rows -> %s\n", rows.size(), o.out.string().c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      code = 1;
    }
  }
  SCAPE_MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, world));
  return code;
}

}  // namespace scape::runtime
