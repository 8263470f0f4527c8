// With a CUDA device (exit 77, skipped, without one; one process, no MPI): SCAPE with its
// kernels and state on the GPU (config.device = cuda) over NcclComm, W = 1, 50 steps of the
// noisy quadratic, against the same run on the CPU backend over EmulatedComm
// (tests/quadratic_run.hpp). Masks must be bit-identical at every step. Parameters: the CUDA
// kernels are built with --fmad=false and do each coordinate's arithmetic in the CPU
// kernels' order, and at W = 1 every collective moves values unchanged, so they are expected
// to be bit-identical; the check allows 4 ulp of the larger magnitude per coordinate (room
// for a last-bit difference in a libm-style function such as sqrt, far below the lr-sized
// step a wrong term would cause) and prints the largest difference seen.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "optimizers/make_optimizer.hpp"
#include "runtime/nccl_comm.hpp"
#include "tests/quadratic_run.hpp"

using namespace scape;

namespace {

constexpr int kSteps = 50;

OptimizerConfig scape_config() {
  OptimizerConfig c;
  c.type = OptimizerType::scape;
  c.sparsity = 0.9;
  c.lr = 1e-2;
  c.warmup_steps = 2;
  return c;
}

// Distance in units in the last place between two finite floats of the same sign; the
// magnitude difference in ulps of the larger value otherwise.
double ulps(float a, float b) {
  if (a == b) return 0;
  const float big = std::max(std::fabs(a), std::fabs(b));
  const double ulp = std::nextafter(big, std::numeric_limits<float>::infinity()) - big;
  return std::fabs(static_cast<double>(a) - b) / ulp;
}

void compare_with_cpu(const OptimizerConfig& base, const char* label) {
  CAPTURE(label);
  const ParamLayout layout = testing::mixed_layout(4);
  const auto cpu = testing::run_quadratic(base, layout, 1, kSteps);

  OptimizerConfig config = base;
  config.device = kernels::DeviceKind::cuda;
  auto comm = runtime::make_single_process_nccl_comm(NetworkModel{});
  scape::train::QuadraticSpec spec;
  spec.seed = 7;     // run_quadratic's defaults
  spec.noise = 0.5;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  auto opt = make_optimizer(config, layout, *comm, kSteps);
  std::vector<float> theta(layout.size()), g(layout.size());
  problem.initial_params(theta);
  double worst_ulps = 0, worst_abs = 0;
  std::size_t mask_mismatches = 0, param_mismatches = 0, identical_steps = 0;
  for (int t = 1; t <= kSteps; ++t) {
    CAPTURE(t);
    problem.gradient(theta, t, 0, g);
    opt->step(theta, g);
    SCAPE_CUDA_CHECK(cudaDeviceSynchronize());  // before reading mask() on the host
    const auto& want = cpu.steps[0][static_cast<std::size_t>(t - 1)];
    const auto mask = opt->mask();
    const std::vector<std::uint64_t> got_mask(mask.begin(), mask.end());
    mask_mismatches += got_mask != want.mask;
    bool identical = true;
    for (std::size_t j = 0; j < theta.size(); ++j) {
      const double u = ulps(theta[j], want.params_after[j]);
      worst_ulps = std::max(worst_ulps, u);
      worst_abs = std::max(worst_abs, std::fabs(static_cast<double>(theta[j]) - want.params_after[j]));
      identical = identical && theta[j] == want.params_after[j];
      param_mismatches += u > 4.0;
    }
    identical_steps += identical;
  }
  opt->finish();
  opt.reset();
  comm.reset();
  std::printf("%s: %d steps, masks differ at %zu steps, parameters bit-identical at %zu steps, max diff %.3g ulp "
              "(%.3g absolute)\n",
              label, kSteps, mask_mismatches, identical_steps, worst_ulps, worst_abs);
  CHECK(mask_mismatches == 0);
  CHECK(param_mismatches == 0);
}

}  // namespace

TEST_CASE("SCAPE on the GPU over NCCL equals SCAPE on the CPU over EmulatedComm (W = 1)") {
  compare_with_cpu(scape_config(), "fp32 wire, lagged mask");
  OptimizerConfig bf16 = scape_config();
  bf16.wire_dtype = WireType::bf16;
  bf16.param_dtype = WireType::bf16;
  compare_with_cpu(bf16, "bf16 wire");
  OptimizerConfig replicated = scape_config();
  replicated.sharded = false;
  replicated.scape.mask_lag = 0;
  replicated.sparsity = 0.99;
  compare_with_cpu(replicated, "replicated, mask lag 0, density 0.01");
}

int main(int argc, char** argv) {
  if (kernels::cuda::visible_device_count() == 0) {
    std::printf("no CUDA device visible: NCCL tests skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  try {
    return context.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
