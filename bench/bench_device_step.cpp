// Cost of a SCAPE step with the residual offloaded to pinned host memory, against the same
// step with the residual resident, on each backend this machine has (cpu; cuda when a device
// is visible). Each iteration runs one resident and one offloaded step on the same gradient, so
// the reported overhead (offloaded / resident - 1) is a ratio measured in the same run. The
// offloaded step moves the residual across the bus once per pass (upload and copy-back), so
// on a GPU the floor is about 2 * 4N bytes over the host link per pass.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "core/optimizer.hpp"
#include "kernels/backend.hpp"
#include "optimizers/optimizer_config.hpp"
#include "optimizers/scape/scape_optimizer.hpp"
#include "sim/emulated_comm.hpp"
#include "util/rng.hpp"

namespace {

using scape::kernels::DeviceKind;

scape::OptimizerConfig config_for(DeviceKind device, bool offload, std::size_t chunk) {
  scape::OptimizerConfig c;
  c.type = scape::OptimizerType::scape;
  c.sparsity = 0.99;
  c.device = device;
  c.residual_offload = offload;
  c.offload_chunk = chunk;
  return c;
}

// Parameters and gradients in memory the backend's kernels address directly (managed memory
// on the GPU), so the step is timed without staging.
struct Inputs {
  Inputs(scape::kernels::KernelBackend& backend, std::size_t n) : params(backend, n), grads(backend, n) {
    backend.synchronize();
    const std::uint64_t key = scape::rng::derive(42, 7);
    for (std::size_t j = 0; j < n; ++j) {
      params.data()[j] = static_cast<float>(scape::rng::normal(key, j));
      grads.data()[j] = static_cast<float>(scape::rng::normal(key, n + j));
    }
  }
  scape::kernels::Buffer<float> params, grads;
};

double seconds_of_step(scape::Optimizer& opt, Inputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  benchmark::DoNotOptimize(opt.step(in.params.span(), in.grads.span()));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_OffloadOverhead(benchmark::State& state, DeviceKind device) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto chunk = static_cast<std::size_t>(state.range(1));
  scape::ParamLayout layout;
  layout.add("w", {n}, true);
  auto backend = scape::kernels::make_backend(device);
  Inputs resident_in(*backend, n), offloaded_in(*backend, n);
  double resident_s = 0, offloaded_s = 0;
  std::size_t device_bytes_resident = 0, device_bytes_offloaded = 0;
  scape::sim::run_ranks(1, scape::NetworkModel{}, [&](scape::Communicator& comm) {
    const auto resident_config = config_for(device, false, chunk);
    const auto offloaded_config = config_for(device, true, chunk);
    scape::ScapeOptimizer resident(resident_config, resident_config.scape, layout, comm, 1000000);
    scape::ScapeOptimizer offloaded(offloaded_config, offloaded_config.scape, layout, comm, 1000000);
    device_bytes_resident = resident.residual_device_bytes();
    device_bytes_offloaded = offloaded.residual_device_bytes();
    // Two warm-up steps: the first computes its mask in place, the second receives a lagged one.
    for (int t = 0; t < 2; ++t) {
      seconds_of_step(resident, resident_in);
      seconds_of_step(offloaded, offloaded_in);
    }
    for (auto _ : state) {
      const double r = seconds_of_step(resident, resident_in);
      const double o = seconds_of_step(offloaded, offloaded_in);
      resident_s += r;
      offloaded_s += o;
      state.SetIterationTime(r + o);
    }
    resident.finish();
    offloaded.finish();
  });
  const double iterations = static_cast<double>(state.iterations());
  state.counters["resident_step_ms"] = 1e3 * resident_s / iterations;
  state.counters["offloaded_step_ms"] = 1e3 * offloaded_s / iterations;
  state.counters["offload_overhead"] = offloaded_s / resident_s - 1.0;
  state.counters["device_MiB_saved"] = static_cast<double>(device_bytes_resident - device_bytes_offloaded) / (1 << 20);
  state.SetLabel(backend->description());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RegisterBenchmark("offload_overhead/cpu", BM_OffloadOverhead, DeviceKind::cpu)
      ->Args({1 << 22, 1 << 20})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  if (scape::kernels::cuda_device_count() > 0) {
    benchmark::RegisterBenchmark("offload_overhead/cuda", BM_OffloadOverhead, DeviceKind::cuda)
        ->Args({1 << 26, 1 << 22})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  } else {
    std::printf("no CUDA device visible: offload_overhead/cuda not run\n");
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
