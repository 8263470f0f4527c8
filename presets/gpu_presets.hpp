// GPU presets of the predictor (peak dense bf16 throughput and memory bandwidth from the
// vendor datasheets; docs/PREDICTING.md lists the sources) and the GPU a prediction uses.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace scape::presets {

// Efficiency of one bf16 GEMM on a GPU as a function of its arithmetic intensity x (FLOPs per
// byte of its two inputs and its output): e(x) = max_efficiency * x / (x + ridge_flop_per_byte),
// a smooth roofline that tends to max_efficiency of the dense peak for large GEMMs and to the
// memory-bound rate for small ones (docs/PREDICTING.md, "Per-GEMM compute"). max_efficiency 0:
// no curve fitted for this GPU (predictions use the MFU).
struct GemmCurve {
  double peak_TFLOPs = 0;          // dense bf16 peak the efficiency multiplies
  double ridge_flop_per_byte = 0;  // intensity at which a GEMM reaches half of max_efficiency
  double max_efficiency = 0;       // fraction of the peak that large GEMMs reach, in (0, 1]
  double memory_TBps = 0;          // elementwise kernels (norms, activations, loss) stream at this
  bool fitted() const { return max_efficiency > 0; }
};

struct GpuPreset {
  const char* name;
  const char* description;
  double peak_bf16_TFLOPs;  // dense (no 2:4 sparsity), 1e12 FLOP/s
  double memory_TBps;       // device memory bandwidth, 1e12 bytes/s
  double host_link_GBps;    // host-device link, one direction, 1e9 bytes/s
  const char* source;
  GemmCurve gemm{};  // fitted to measured step tables where there are any (gh200), else unfitted
};

const std::vector<GpuPreset>& gpu_presets();
// Throws std::invalid_argument naming `field` and listing the presets when unknown.
const GpuPreset& find_gpu_preset(std::string_view name, std::string_view field);

// MFU 0.4 is the default: a stated assumption for well-tuned dense training at this scale.
constexpr double kDefaultMfu = 0.4;

struct GpuSpec {
  std::string preset;          // "" when every figure was given explicitly
  double peak_TFLOPs = 989.0;  // dense bf16
  double mfu = kDefaultMfu;    // achieved fraction of the peak, in (0, 1]
  double memory_TBps = 3.35;
  // Throughputs of the optimizer's kernels over the bytes they touch. 0: the memory bandwidth
  // (every one is a streaming kernel); calibration or a measured figure replaces them.
  double select_TBps = 0;     // top-k selection: the statistic and the selection passes
  double pack_TBps = 0;       // mask packing: gather the masked values, zero the residual
  double host_link_GBps = 64;  // residual offload: host-device copies, one direction
  // Mask coordinates coded and decoded per second, 1e9, as measured (bench_codec, or a run's
  // mask_codec_time); 0 costs the coding as the memory traffic of the CUDA kernels at
  // memory_TBps instead (docs/PREDICTING.md, "Mask coding").
  double mask_codec_Gcoords_per_s = 0.0;

  double achieved_flops() const { return peak_TFLOPs * 1e12 * mfu; }
  double memory_Bps() const { return memory_TBps * 1e12; }
  double select_Bps() const { return select_TBps > 0 ? select_TBps * 1e12 : memory_Bps(); }
  double pack_Bps() const { return pack_TBps > 0 ? pack_TBps * 1e12 : memory_Bps(); }
  double host_link_Bps() const { return host_link_GBps * 1e9; }
};

}  // namespace scape::presets
