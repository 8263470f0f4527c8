// GPU presets (docs/PREDICTING.md, "GPU presets", has the sources).
#include "presets/gpu_presets.hpp"

#include "util/name_table.hpp"

namespace scape::presets {

namespace {

// The GEMM curve of the SCAPE artifact's GH200s (TACC Vista): the ridge at the datasheet's peak
// over its memory bandwidth, max_efficiency fitted by `scape predict --calibrate-table` to the
// artifact's Llama-500M step table (experiments/hardware/tacc-vista-measured.json, whose
// gemm_curve a test holds this to; fitted to the Llama-1.8B table instead it is 0.7787).
constexpr GemmCurve kGh200Curve{989.0, 989.0 / 4.9, 0.7771663158158673, 4.9};

}  // namespace

const std::vector<GpuPreset>& gpu_presets() {
  // Datasheets quote bf16 tensor throughput with 2:4 sparsity; the dense figure is half. Host
  // links: PCIe Gen4 x16 (A100) and Gen5 x16 (H100, H200 SXM) per direction; NVLink-C2C's
  // 900 GB/s total on GH200, 450 per direction.
  static const std::vector<GpuPreset> presets = {
      {"a100", "NVIDIA A100 SXM4 80 GB (HBM2e)", 312.0, 2.039, 32.0, "NVIDIA A100 Tensor Core GPU datasheet"},
      {"h100", "NVIDIA H100 SXM5 80 GB (HBM3)", 989.0, 3.35, 64.0, "NVIDIA H100 Tensor Core GPU datasheet"},
      {"h200", "NVIDIA H200 SXM 141 GB (HBM3e)", 989.0, 4.8, 64.0, "NVIDIA H200 Tensor Core GPU datasheet"},
      {"gh200", "NVIDIA GH200 Grace Hopper Superchip, 144 GB HBM3e GPU memory", 989.0, 4.9, 450.0,
       "NVIDIA GH200 Grace Hopper Superchip datasheet", kGh200Curve},
  };
  return presets;
}

const GpuPreset& find_gpu_preset(std::string_view name, std::string_view field) {
  return find_by_name(gpu_presets(), name, field, "GPU preset");
}

}  // namespace scape::presets
