// scape bench-comm: under mpirun, every collective the optimizers use timed over a range of sizes.
#include "apps/cli_common.hpp"

#ifdef SCAPE_HAVE_MPI
#include "runtime/bench_comm.hpp"
#endif
#ifdef SCAPE_HAVE_NCCL
#include "runtime/nccl_run.hpp"
#endif

namespace scape::cli {
namespace {

int cmd_bench_comm(const std::string& backend, const std::string& out, std::size_t min_bytes, std::size_t max_bytes,
                   double factor, int iters, int warmup, double idle_gap_ms) {
#ifdef SCAPE_HAVE_MPI
  scape::runtime::BenchCommOptions o;
  o.min_bytes = min_bytes;
  o.max_bytes = max_bytes;
  o.factor = factor;
  o.iters = iters;
  o.warmup = warmup;
  o.idle_gap_s = idle_gap_ms * 1e-3;
  o.out = out;
  if (backend == "nccl") {
#ifdef SCAPE_HAVE_NCCL
    return scape::runtime::bench_comm(MPI_COMM_WORLD, scape::runtime::nccl_bench_backend(), o);
#else
    throw cfg::ConfigError("bench-comm --backend nccl: this scape was built without the NCCL communicator");
#endif
  }
  return scape::runtime::bench_comm(MPI_COMM_WORLD, scape::runtime::mpi_bench_backend(), o);
#else
  (void)backend, (void)out, (void)min_bytes, (void)max_bytes, (void)factor, (void)iters, (void)warmup,
      (void)idle_gap_ms;
  throw cfg::ConfigError("bench-comm: this scape was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}

struct BenchArgs {
  std::string backend = "mpi";
  std::string out = "bench-comm.h5";
  std::size_t min_bytes = 1024, max_bytes = std::size_t{64} << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  double idle_gap_ms = 0;
};

}  // namespace

Command add_bench_comm_command(CLI::App& app) {
  const auto a = std::make_shared<BenchArgs>();
  auto* bench = app.add_subcommand(
      "bench-comm", "under mpirun: time every collective the optimizers use over a range of sizes (algbw, busbw as "
                    "nccl-tests) and write them for `scape predict --calibrate`");
  bench->add_option("--backend", a->backend, "mpi or nccl (one GPU per rank)")
      ->check(CLI::IsMember({"mpi", "nccl"}))
      ->capture_default_str();
  bench->add_option("--out", a->out, "HDF5 file of the rows")->capture_default_str();
  bench->add_option("--min-bytes", a->min_bytes, "payload of the smallest size")->capture_default_str();
  bench->add_option("--max-bytes", a->max_bytes, "payload of the largest size")->capture_default_str();
  bench->add_option("--factor", a->factor, "ratio between sizes")->capture_default_str();
  bench->add_option("--iters", a->iters, "timed calls per size")->capture_default_str();
  bench->add_option("--warmup", a->warmup, "untimed calls per size")->capture_default_str();
  bench
      ->add_option("--idle-gap-ms", a->idle_gap_ms,
                   "> 0: time every size again, each call after this many ms of idle link (rows marked idle, for "
                   "the link regimes of `scape predict --calibrate --links-from-bench`)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  Command c;
  c.sub = bench;
  c.run = [a] {
    return cmd_bench_comm(a->backend, a->out, a->min_bytes, a->max_bytes, a->factor, a->iters, a->warmup,
                          a->idle_gap_ms);
  };
  c.under_mpi = [] { return true; };
  c.mpi_backend = [a] { return a->backend; };
  return c;
}

}  // namespace scape::cli
