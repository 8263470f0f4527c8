// GPU presets of the predictor (peak dense bf16 throughput and memory bandwidth from the
// vendor datasheets; docs/PREDICTING.md lists the sources) and the GPU a prediction uses.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace scape::presets {

struct GpuPreset {
  const char* name;
  const char* description;
  double peak_bf16_TFLOPs;  // dense (no 2:4 sparsity), 1e12 FLOP/s
  double memory_TBps;       // device memory bandwidth, 1e12 bytes/s
  double host_link_GBps;    // host-device link, one direction, 1e9 bytes/s
  const char* source;
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
