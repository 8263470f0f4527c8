// The key tables of experiment configs but the optimizer's (optimizer_keys.cpp), one row per key.
// A row names no default: the default is the member's value in the default-built struct.
#include "config/config_keys.hpp"

#include <string>
#include <vector>

#include "config/key_table_support.hpp"

namespace scape::config {
namespace {

using namespace key_table_support;

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets::gpu_presets()) names.emplace_back(p.name);
  return names;
}

}  // namespace

const KeyTable<ExperimentConfig>& top_keys() {
  using C = ExperimentConfig;
  static const KeyTable<C> t({
      {{"name", Kind::string, "run name (used in file names and tables)"}, SCAPE_MEMBER(C, name)},
      {{"description", Kind::string, "free text: what the run tests; stored with the run"},
       SCAPE_MEMBER(C, description)},
      {{"seed", Kind::integer, "seed of every random choice (init, data, noise, random masks)", {0, 9.007e15}},
       SCAPE_MEMBER(C, seed)},
      {{"workers", Kind::integer, "number of data-parallel workers W", {1, 1024}}, SCAPE_MEMBER(C, workers)},
      {{"steps", Kind::integer, "optimizer steps T", {1, 1e9}}, SCAPE_MEMBER(C, steps)},
      {{"device",
        Kind::string,
        "where the model, its parameters and gradients live and run; the optimizer follows unless optimizer.device "
        "is given (cuda: gpt and llama only, needs a CUDA build and a GPU)",
        {},
        kernels::device_kind_names()},
       SCAPE_MEMBER(C, device)},
      {{"model", Kind::object, "model section"}},
      {{"data", Kind::object, "data section (gpt and llama models only)"}},
      {{"optimizer", Kind::object, "optimizer section"}},
      {{"topology", Kind::object, "where the ranks sit: nodes of ranks_per_node consecutive ranks"}},
      {{"network", Kind::object, "network model for modelled communication time"}},
      {{"compute", Kind::object, "what the modelled step time takes as compute: measured or from FLOPs"}},
      {{"eval", Kind::object, "validation section (gpt, llama and external models)"}},
      {{"log", Kind::object, "logging section"}},
  });
  return t;
}

const KeyTable<ModelSection>& model_keys() {
  using C = ModelSection;
  static const KeyTable<C> t({
      {{"type",
        Kind::string,
        "gpt, llama (RMSNorm, RoPE, SwiGLU, untied head), replay (gradients from a trace file), quadratic "
        "(noisy quadratic) or external (gradients handed in by the caller: the Python package's scape.Simulator; "
        "scape run cannot produce them)",
        {},
        {"gpt", "llama", "replay", "quadratic", "external"}},
       SCAPE_MEMBER(C, type)},
      {{"n_layer", Kind::integer, "transformer blocks", {1, 64}, {}, {"gpt", "llama"}}, SCAPE_MEMBER(C, n_layer)},
      {{"n_head", Kind::integer, "attention heads (must divide n_embd)", {1, 64}, {}, {"gpt", "llama"}},
       SCAPE_MEMBER(C, n_head)},
      {{"n_embd",
        Kind::integer,
        "embedding width (llama: n_embd / n_head must be even)",
        {1, 4096},
        {},
        {"gpt", "llama"}},
       SCAPE_MEMBER(C, n_embd)},
      {{"block_size", Kind::integer, "sequence length T", {1, 4096}, {}, {"gpt", "llama"}},
       SCAPE_MEMBER(C, block_size)},
      {{"vocab_size",
        Kind::integer,
        "vocabulary (256 for bytes, 50257 for GPT-2 tokens)",
        {2, 1 << 20},
        {},
        {"gpt", "llama"}},
       SCAPE_MEMBER(C, vocab_size)},
      {{"n_kv_head",
        Kind::integer,
        "key/value heads of grouped-query attention (must divide n_head; 0: n_head)",
        {0, 64},
        {},
        {"llama"}},
       SCAPE_MEMBER(C, n_kv_head)},
      {{"precision",
        Kind::string,
        "GEMMs of the linear layers: fp32, or bf16 (operands rounded to bf16, fp32 sums; master weights, "
        "activations, norms, attention and loss stay fp32)",
        {},
        {"fp32", "bf16"},
        {"gpt", "llama"}},
       SCAPE_MEMBER(C, precision)},
      {{"ffn_hidden",
        Kind::integer,
        "SwiGLU hidden size (0: 8/3 n_embd rounded up to a multiple of 64)",
        {0, 65536},
        {},
        {"llama"}},
       SCAPE_MEMBER(C, ffn_hidden)},
      {{"path", Kind::string, "trace file (HDF5), relative to the config file", {}, {}, {"replay"}},
       SCAPE_MEMBER(C, path),
       Default::required},
      {{"size", Kind::integer, "number of parameters", {64, 4e9}, {}, {"quadratic"}}, SCAPE_MEMBER(C, size)},
      {{"noise", Kind::number, "gradient noise sigma", {0, kInf}, {}, {"quadratic"}}, SCAPE_MEMBER(C, noise)},
      {{"curvature_tail",
        Kind::number,
        "Pareto shape of the curvature (smaller = heavier tail)",
        {0, kInf, true},
        {},
        {"quadratic"}},
       SCAPE_MEMBER(C, curvature_tail)},
  });
  return t;
}

const KeyTable<DataSection>& data_keys() {
  using C = DataSection;
  static const KeyTable<C> t({
      {{"type",
        Kind::string,
        "synthetic (built-in Markov corpus), text (bytes of a file) or tokens (.bin shards)",
        {},
        {"synthetic", "text", "tokens"}},
       SCAPE_MEMBER(C, type)},
      {{"path", Kind::string, "the file, relative to the config file", {}, {}, {"text", "tokens"}},
       SCAPE_MEMBER(C, path),
       Default::required},
      {{"format",
        Kind::string,
        "nanogpt (raw uint16), llmc (256-int32 header) or auto (by header magic)",
        {},
        {"auto", "nanogpt", "llmc"},
        {"tokens"}},
       SCAPE_MEMBER(C, format)},
      {{"batch_size", Kind::integer, "sequences per worker per step", {1, 1 << 20}}, SCAPE_MEMBER(C, batch_size)},
      {{"val_fraction", Kind::number, "fraction of the tokens held out for validation", {0, 0.9, true}},
       SCAPE_MEMBER(C, val_fraction)},
      {{"tokens", Kind::integer, "corpus length in tokens", {1000, 1e10}, {}, {"synthetic"}}, SCAPE_MEMBER(C, tokens)},
      {{"successors", Kind::integer, "favoured successors per state", {1, 1 << 20}, {}, {"synthetic"}},
       SCAPE_MEMBER(C, successors)},
      {{"concentration",
        Kind::number,
        "probability mass on the favoured successors",
        {0, 1, false, true},
        {},
        {"synthetic"}},
       SCAPE_MEMBER(C, concentration)},
  });
  return t;
}

const KeyTable<NetworkSection>& network_keys() {
  using C = NetworkSection;
  static const KeyTable<C> t({
      {{"preset", Kind::string, "ib_ndr400, nvlink_h100, pcie_gen5, eth_100g, loopback or wan_1g (docs/network.md)"},
       SCAPE_MEMBER(C, preset)},
      {{"alpha_us", Kind::number, "latency per message step in microseconds (overrides the preset)", {0, kInf}},
       SCAPE_MEMBER(C, alpha_us),
       Default::derived},
      {{"bandwidth_GBps", Kind::number, "per-worker bandwidth in GB/s (overrides the preset)", {0, kInf, true}},
       SCAPE_MEMBER(C, bandwidth_GBps),
       Default::derived},
      {{"intra", Kind::string,
        "preset of the link between the ranks of one node (topology.ranks_per_node > 1), e.g. nvlink_h100; "
        "default: the link between nodes; recorded only when given"},
       SCAPE_MEMBER(C, intra)},
  });
  return t;
}

const KeyTable<TopologySection>& topology_keys() {
  using C = TopologySection;
  static const KeyTable<C> t({
      {{"ranks_per_node",
        Kind::integer,
        "G, ranks of one node (consecutive ranks); must divide workers (W = nodes x G); recorded only when > 1",
        {1, 1024}},
       SCAPE_MEMBER(C, ranks_per_node)},
  });
  return t;
}

const KeyTable<ComputeSection>& compute_keys() {
  using C = ComputeSection;
  static const KeyTable<C> t({
      {{"type",
        Kind::string,
        "measured (thread CPU seconds of forward/backward), flops (training FLOPs of the gpt shape on a GPU) or "
        "sleep (each rank sleeps out compute.seconds a step: a GPU stand-in)",
        {},
        {"measured", "flops", "sleep"}},
       SCAPE_MEMBER(C, type)},
      {{"device",
        Kind::string,
        "GPU preset of scape predict whose dense bf16 peak the FLOPs run at",
        {},
        gpu_preset_names(),
        {"flops"}},
       SCAPE_MEMBER(C, device)},
      {{"mfu", Kind::number, "achieved fraction of the device's peak", {0, 1, true}, {}, {"flops"}},
       SCAPE_MEMBER(C, mfu)},
      {{"seconds",
        Kind::number,
        "sleep: seconds of forward and backward a step stands for",
        {0, 3600, true},
        {},
        {"sleep"}},
       SCAPE_MEMBER(C, seconds)},
  });
  return t;
}

const KeyTable<EvalSection>& eval_keys() {
  using C = EvalSection;
  static const KeyTable<C> t({
      {{"interval", Kind::integer, "steps between validation evaluations (the last step always evaluates)", {1, 1e9}},
       SCAPE_MEMBER(C, interval)},
      {{"batches", Kind::integer, "validation batches per evaluation", {1, 1e6}}, SCAPE_MEMBER(C, batches)},
  });
  return t;
}

const KeyTable<LogSection>& log_keys() {
  using C = LogSection;
  static const KeyTable<C> t({
      {{"flush_interval", Kind::integer, "steps between flushes of the run file", {1, 1e9}},
       SCAPE_MEMBER(C, flush_interval)},
      {{"save_params", Kind::boolean, "write the final parameters to /final/params"}, SCAPE_MEMBER(C, save_params)},
      {{"oracle", Kind::boolean,
        "compute mask_oracle_overlap and mask_energy_capture (a copy of a_i per worker per step); the default is "
        "false with --backend mpi or nccl, where a_i travels to rank 0"},
       SCAPE_MEMBER(C, oracle)},
      {{"gradient_metrics_interval",
        Kind::integer,
        "steps between the metrics that need every worker's whole gradient on rank 0 (grad_norm, the oracle "
        "metrics): taken at steps 1, 1 + k, ...; in a multi-process run each costs W N floats sent to rank 0, and "
        "the default there is 100",
        {1, 1e9}},
       SCAPE_MEMBER(C, gradient_metrics_interval)},
  });
  return t;
}

#undef SCAPE_MEMBER

}  // namespace scape::config
