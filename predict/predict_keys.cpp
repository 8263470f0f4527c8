// The Field lists of prediction configs. Fixed defaults are read from the default-built structs
// (predict_config.hpp, step_model.hpp, hardware.hpp); the link keys are the run configs' own.
#include "predict/predict_keys.hpp"

#include <limits>

#include "config/config_keys.hpp"
#include "predict/predict_config.hpp"

namespace scape::predict {
namespace {

using config::Kind;
using nlohmann::json;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Field> link_fields(const char* default_preset) {
  std::vector<Field> f = config::network_keys().fields;
  for (auto& field : f) {
    if (std::string(field.key) == "preset") field.default_value = default_preset;
  }
  return f;
}

}  // namespace

const std::vector<Field>& top_fields() {
  static const PredictConfig d;
  static const std::vector<Field> f = {
      {"name", Kind::string, "label of the prediction (file names, tables)", {}, {}, {}, d.name},
      {"description", Kind::string, "free text stored with the prediction", {}, {}, {}, d.description},
      {"workers", Kind::integer_list, "worker counts (GPUs) to evaluate", {1, 1e6}},
      {"model", Kind::object, "a model preset and/or explicit dimensions"},
      {"batch", Kind::object, "the batch and how it scales with the workers"},
      {"gpu", Kind::object, "the GPU: a preset and/or its figures"},
      {"network", Kind::object, "GPUs per node and the two network levels"},
      {"overlap", Kind::object, "which collectives hide behind compute"},
      {"optimizer", Kind::object, "the optimizer section of a run config (the same parser)"},
      {"baseline", Kind::object, "the dense optimizer compared with (default: AdamS, or AdamW for inner adamw)"},
      {"fill_in", Kind::number, "SCAPE local_union: |M| / K", {1, kInf}, {}, {}, d.fill_in},
      {"hardware", Kind::string,
       "a hardware description (`scape predict --calibrate` writes one; relative to this file): its gpu and "
       "network sections, with this config's keys over them"},
  };
  return f;
}

// Every default here follows from the preset or the family (docs/PREDICTING.md).
const std::vector<Field>& model_fields() {
  static const std::vector<Field> f = {
      {"preset", Kind::string, "a model preset; any other model key then overrides that field"},
      {"family", Kind::string, "gpt2 or llama (required with explicit dimensions)"},
      {"n_layer", Kind::integer, "transformer blocks", {1, 10000}},
      {"n_embd", Kind::integer, "embedding width", {1, 1 << 20}},
      {"n_head", Kind::integer, "attention heads", {1, 1 << 16}},
      {"n_kv_head", Kind::integer, "llama grouped-query attention: key-value heads", {1, 1 << 16}},
      {"ffn_hidden", Kind::integer, "MLP hidden width", {1, 1e9}},
      {"vocab_size", Kind::integer, "vocabulary", {2, 1e9}},
      {"context", Kind::integer, "rows of the gpt2 position table; the default batch.seq_len", {1, 1e8}},
      {"tied_embeddings", Kind::boolean, "the output head shares the token table"},
      {"attention_flops", Kind::string, "how attention products are counted", {}, {"causal", "full", "none"}, {},
       to_string(PredictConfig{}.attention)},
  };
  return f;
}

const std::vector<Field>& batch_fields() {
  static const std::vector<Field> f = {
      {"scaling",
       Kind::string,
       "strong: the global batch is fixed; weak: the batch of one GPU is",
       {},
       {"strong", "weak"},
       {},
       to_string(BatchSpec{}.scaling)},
      {"seq_len", Kind::integer, "tokens per sequence (default model.context)", {1, 1e8}},
      {"global_sequences", Kind::integer, "the global batch (weak: at batch.reference_workers)", {1, 1e12}},
      {"per_gpu_sequences", Kind::integer, "weak: the batch of one GPU", {1, 1e12}},
      {"reference_workers", Kind::integer, "weak with global_sequences (default the largest of workers)", {1, 1e6}},
      {"micro_sequences",
       Kind::integer,
       "sequences of one forward/backward, the rows of every GEMM (required with gpu.compute_model gemm)",
       {1, 1e6}},
  };
  return f;
}

const std::vector<Field>& gpu_fields() {
  static const std::vector<Field> f = {
      {"preset", Kind::string, "a GPU preset", {}, {}, {}, "h100"},
      {"peak_TFLOPs", Kind::number, "dense bf16 peak (overrides the preset)", {0, kInf, true}},
      {"mfu", Kind::number, "achieved fraction of the dense peak", {0, 1, true}, {}, {}, presets::GpuSpec{}.mfu},
      {"compute_model",
       Kind::string,
       "mfu: the training FLOPs at gpu.mfu of the peak; gemm: every GEMM on the preset's fitted efficiency curve",
       {},
       {"mfu", "gemm"},
       {},
       "mfu"},
      {"memory_bandwidth_TBps", Kind::number, "device memory bandwidth (overrides the preset)", {0, kInf, true}},
      {"select_TBps",
       Kind::number,
       "throughput of top-k selection over the bytes it touches (default the memory "
       "bandwidth)",
       {0, kInf, true}},
      {"pack_TBps",
       Kind::number,
       "throughput of mask packing over the bytes it touches (default the memory "
       "bandwidth)",
       {0, kInf, true}},
      {"host_link_GBps",
       Kind::number,
       "host-device link per direction, for residual offload (default from the "
       "preset)",
       {0, kInf, true}},
      {"mask_codec_Gcoords_per_s",
       Kind::number,
       "coded SCAPE masks: measured 1e9 coordinates encoded and decoded per second (0: memory-bound model)",
       {0, kInf, false, true},
       {},
       {},
       presets::GpuSpec{}.mask_codec_Gcoords_per_s},
  };
  return f;
}

const std::vector<Field>& network_fields() {
  static const std::vector<Field> f = {
      {"gpus_per_node",
       Kind::integer,
       "GPUs per node on the intra-node link",
       {1, 1024},
       {},
       {},
       PredictConfig{}.gpus_per_node},
      {"nics_per_node",
       Kind::integer,
       "inter-node ports per node, at most gpus_per_node (default gpus_per_node)",
       {1, 1024}},
      {"inter", Kind::object, "per-port link between nodes"},
      {"intra", Kind::object, "per-GPU link inside a node"},
      {"collectives", Kind::object, "calibrated links per collective kind, replacing inter for that kind"},
      {"inter_curves", Kind::object,
       "measured times of the inter link's collectives, idle and busy (scape predict --calibrate with idle "
       "bench-comm rows: workers, rate_scale, idle and busy curves by kind); none: the alpha-beta lines"},
  };
  return f;
}

const std::vector<Field>& collectives_fields() {
  static const std::vector<Field> f = {
      {"all_reduce", Kind::object, "alpha_us and bandwidth_GBps of all-reduce rings"},
      {"reduce_scatter", Kind::object, "alpha_us and bandwidth_GBps of reduce-scatter rings"},
      {"all_gather", Kind::object, "alpha_us and bandwidth_GBps of all-gather rings"},
  };
  return f;
}

const std::vector<Field>& measured_link_fields() {
  static const std::vector<Field> f = [] {
    std::vector<Field> out;
    for (const auto& field : config::network_keys().fields) {
      if (std::string(field.key) != "preset") out.push_back(field);
    }
    return out;
  }();
  return f;
}

const std::vector<Field>& inter_fields() {
  static const std::vector<Field> f = link_fields("ib_ndr400");
  return f;
}

const std::vector<Field>& intra_fields() {
  static const std::vector<Field> f = link_fields("nvlink_h100");
  return f;
}

const std::vector<Field>& overlap_fields() {
  static const OverlapModel d;
  static const std::vector<Field> f = {
      {"grad_reduce", Kind::boolean, "dense gradient reduction bucketed into the backward pass", {}, {}, {},
       d.grad_reduce},
      {"param_gather", Kind::boolean, "parameter all-gather bucketed into the next forward pass", {}, {}, {},
       d.param_gather},
      {"sparse_reduce", Kind::boolean, "SCAPE (lag 1) reduction bucketed into the backward pass too", {}, {}, {},
       d.sparse_reduce},
      {"mask_gather", Kind::boolean, "SCAPE's lagged mask all-gather behind forward and backward", {}, {}, {},
       d.mask_gather},
      {"bucket_MB", Kind::number, "bucket size of the bucketed collectives, 1e6 bytes", {0, kInf, true}, {}, {},
       d.bucket_MB},
  };
  return f;
}

}  // namespace scape::predict
