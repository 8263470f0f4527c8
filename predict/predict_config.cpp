// Strict parsing of prediction configs with the shared section parser
// (config/json_section.hpp) and the keys of predict_keys.cpp: unknown keys get a "did you
// mean", wrong types and out-of-range values name the JSON path. What remains here are the
// defaults that follow from other keys (presets, family, worker counts) and the checks that
// span keys.
#include "predict/predict_config.hpp"

#include <algorithm>
#include <cstdio>

#include "config/config.hpp"
#include "predict/predict_keys.hpp"
#include "presets/network_presets.hpp"

namespace scape::predict {
namespace {

using config::comma_list;
using config::config_error;
using config::ConfigError;
using config::fail;
using config::Section;
using nlohmann::json;

std::vector<std::string> names_of(const auto& presets) {
  std::vector<std::string> out;
  for (const auto& p : presets) out.emplace_back(p.name);
  return out;
}

void check_model_shape(const presets::ModelSpec& m) {
  if (m.n_embd % m.n_head != 0) {
    fail("model.n_head", std::to_string(m.n_head) + " does not divide model.n_embd = " + std::to_string(m.n_embd));
  }
  if (m.n_head % m.n_kv_head != 0) {
    fail("model.n_kv_head",
         std::to_string(m.n_kv_head) + " does not divide model.n_head = " + std::to_string(m.n_head));
  }
  if (m.family == presets::Family::gpt2 && m.n_kv_head != m.n_head) {
    fail("model.n_kv_head", "grouped-query attention is only defined for family llama");
  }
}

presets::ModelSpec parse_model(const Section& s, std::string& preset) {
  presets::ModelSpec m;
  preset = s.value_or<std::string>("preset", "");
  if (!preset.empty()) {
    m = config_error([&] { return presets::find_model_preset(preset, "model.preset").spec; });
  } else {
    for (const char* k : {"family", "n_layer", "n_embd", "n_head", "vocab_size"}) {
      s.require(k, "when no model.preset is given (presets: " + comma_list(names_of(presets::model_presets())) + ")");
    }
  }
  if (s.has("family")) {
    m.family = config_error([&] { return presets::parse_family(s.at("family").get<std::string>(), "model.family"); });
    if (preset.empty()) {
      m.context = m.family == presets::Family::gpt2 ? 1024 : 2048;
      m.tied_embeddings = m.family == presets::Family::gpt2;
    }
  }
  m.n_layer = s.value_or("n_layer", m.n_layer);
  m.n_embd = s.value_or("n_embd", m.n_embd);
  m.n_head = s.value_or("n_head", m.n_head);
  // A changed width, head count or family re-derives the defaults that follow from them
  // (MLP width, key-value heads) unless those are given too.
  if (s.has("n_embd") || s.has("family")) {
    m.ffn_hidden = m.family == presets::Family::gpt2 ? 4 * static_cast<std::int64_t>(m.n_embd)
                                                     : presets::llama_ffn_hidden(m.n_embd);
  }
  if (s.has("n_head") || s.has("family")) m.n_kv_head = m.n_head;
  m.n_kv_head = s.value_or("n_kv_head", m.n_kv_head);
  m.ffn_hidden = s.value_or("ffn_hidden", m.ffn_hidden);
  m.vocab_size = s.value_or("vocab_size", m.vocab_size);
  m.context = s.value_or("context", m.context);
  m.tied_embeddings = s.value_or("tied_embeddings", m.tied_embeddings);
  check_model_shape(m);
  return m;
}

LinkSpec parse_link(const json& j, const std::string& path, const std::vector<Field>& fields) {
  const Section s(j, path, fields);
  LinkSpec l;
  const bool both = s.has("alpha_us") && s.has("bandwidth_GBps");
  if (s.has("preset") || !both) {
    l.preset = s.get("preset").get<std::string>();
    const auto& p = config_error(
        [&]() -> const presets::NetworkPreset& { return presets::find_network_preset(l.preset, s.path("preset")); });
    l.alpha_us = p.alpha_us;
    l.bandwidth_GBps = p.bandwidth_GBps;
  }
  l.alpha_us = s.value_or("alpha_us", l.alpha_us);
  l.bandwidth_GBps = s.value_or("bandwidth_GBps", l.bandwidth_GBps);
  return l;
}

presets::GpuSpec parse_gpu(const Section& s) {
  presets::GpuSpec g;
  const bool both = s.has("peak_TFLOPs") && s.has("memory_bandwidth_TBps");
  if (s.has("preset") || !both) {
    g.preset = s.get("preset").get<std::string>();
    const auto& p =
        config_error([&]() -> const presets::GpuPreset& { return presets::find_gpu_preset(g.preset, "gpu.preset"); });
    g.peak_TFLOPs = p.peak_bf16_TFLOPs;
    g.memory_TBps = p.memory_TBps;
  }
  if (!g.preset.empty()) g.host_link_GBps = presets::find_gpu_preset(g.preset, "gpu.preset").host_link_GBps;
  g.peak_TFLOPs = s.value_or("peak_TFLOPs", g.peak_TFLOPs);
  g.memory_TBps = s.value_or("memory_bandwidth_TBps", g.memory_TBps);
  g.select_TBps = s.value_or("select_TBps", g.select_TBps);
  g.pack_TBps = s.value_or("pack_TBps", g.pack_TBps);
  g.host_link_GBps = s.value_or("host_link_GBps", g.host_link_GBps);
  g.mfu = s.get("mfu").get<double>();
  g.mask_codec_Gcoords_per_s = s.get("mask_codec_Gcoords_per_s").get<double>();
  return g;
}

OverlapModel parse_overlap(const Section& s) {
  OverlapModel o;
  o.grad_reduce = s.value_or("grad_reduce", o.grad_reduce);
  o.param_gather = s.value_or("param_gather", o.param_gather);
  o.sparse_reduce = s.value_or("sparse_reduce", o.sparse_reduce);
  o.mask_gather = s.value_or("mask_gather", o.mask_gather);
  o.bucket_MB = s.value_or("bucket_MB", o.bucket_MB);
  return o;
}

// The optimizer section of a run config, parsed by the run-config parser so that every key,
// default and check is the same; `path` renames the section in its messages.
OptimizerConfig parse_optimizer_section(const json& j, const std::string& path) {
  const json run = {{"model", {{"type", "quadratic"}}}, {"optimizer", j}};
  try {
    const OptimizerConfig c = config::parse_experiment(run, ".").optimizer;
    // PowerSGD's factors follow the tensor shapes, which a prediction (N only) does not have.
    if (c.type == OptimizerType::powersgd) {
      throw ConfigError("optimizer.type: powersgd cannot be predicted: its bytes depend on the tensor shapes, and "
                        "scape predict knows only the parameter count");
    }
    return c;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    if (path == "optimizer" || what.rfind("optimizer", 0) != 0) throw;
    throw ConfigError(path + what.substr(std::string("optimizer").size()));
  }
}

std::vector<int> parse_workers(const Section& top) {
  top.require("workers", "(the list of worker counts to evaluate)");
  return top.at("workers").get<std::vector<int>>();
}

void check_placement(const PredictConfig& c) {
  for (std::size_t i = 0; i < c.workers.size(); ++i) {
    const int w = c.workers[i];
    if (w > c.gpus_per_node && w % c.gpus_per_node != 0) {
      fail("workers[" + std::to_string(i) + "]", std::to_string(w) + " is not a multiple of network.gpus_per_node = " +
                                                    std::to_string(c.gpus_per_node));
    }
  }
}

BatchSpec parse_batch(const Section& s, const PredictConfig& c) {
  BatchSpec b;
  b.scaling = s.get("scaling") == "weak" ? Scaling::weak : Scaling::strong;
  b.seq_len = s.value_or("seq_len", c.model.context);
  b.micro_sequences = s.value_or<std::int64_t>("micro_sequences", 0);
  if (c.model.family == presets::Family::gpt2 && b.seq_len > c.model.context) {
    fail(s.path("seq_len"), std::to_string(b.seq_len) + " exceeds model.context = " + std::to_string(c.model.context) +
                                " (the rows of the position table)");
  }
  if (b.scaling == Scaling::strong) {
    s.require("global_sequences", "for strong scaling (the global batch in sequences)");
    s.forbid("per_gpu_sequences", "only valid for batch.scaling \"weak\"");
    s.forbid("reference_workers", "only valid for batch.scaling \"weak\"");
    b.global_sequences = s.at("global_sequences").get<std::int64_t>();
    for (std::size_t i = 0; i < c.workers.size(); ++i) {
      if (b.global_sequences % c.workers[i] != 0) {
        fail(s.path("global_sequences"),
             std::to_string(b.global_sequences) + " sequences do not split evenly over workers[" + std::to_string(i) +
                 "] = " + std::to_string(c.workers[i]) + " (strong scaling keeps the global batch)");
      }
    }
    return b;
  }
  if (s.has("per_gpu_sequences") == s.has("global_sequences")) {
    fail(s.path("per_gpu_sequences"), "weak scaling needs exactly one of batch.per_gpu_sequences and "
                                      "batch.global_sequences (with batch.reference_workers)");
  }
  if (s.has("per_gpu_sequences")) {
    s.forbid("reference_workers", "only valid with batch.global_sequences");
    b.per_gpu_sequences = s.at("per_gpu_sequences").get<std::int64_t>();
    return b;
  }
  const auto global = s.at("global_sequences").get<std::int64_t>();
  const auto reference =
      s.value_or<std::int64_t>("reference_workers", *std::max_element(c.workers.begin(), c.workers.end()));
  if (global % reference != 0) {
    fail(s.path("global_sequences"),
         std::to_string(global) + " is not divisible by batch.reference_workers = " + std::to_string(reference) +
             " (weak scaling keeps global_sequences / reference_workers sequences per GPU)");
  }
  b.per_gpu_sequences = global / reference;
  return b;
}

// gpu.compute_model: under "gemm" the GPU preset's fitted curve, with the micro-batch that shapes
// the GEMMs; under "mfu" nothing (and no micro-batch, which it would not use).
presets::GemmCurve parse_compute_model(const Section& gpu, const PredictConfig& c) {
  const std::string model = gpu.get("compute_model").get<std::string>();
  if (model == "mfu") {
    if (c.batch.micro_sequences > 0) fail("batch.micro_sequences", "only valid with gpu.compute_model \"gemm\"");
    return {};
  }
  const presets::GemmCurve curve =
      c.gpu.preset.empty() ? presets::GemmCurve{} : presets::find_gpu_preset(c.gpu.preset, "gpu.preset").gemm;
  if (!curve.fitted()) {
    fail(gpu.path("compute_model"),
         "gemm needs a gpu.preset with a fitted GEMM curve (gh200); '" + c.gpu.preset + "' has none");
  }
  if (c.attention != presets::AttentionFlops::causal) {
    fail("model.attention_flops", "gpu.compute_model \"gemm\" models causal attention only");
  }
  if (c.batch.micro_sequences == 0) {
    fail("batch.micro_sequences", "required with gpu.compute_model \"gemm\" (the sequences of one forward/backward)");
  }
  for (const int w : c.workers) {
    if (static_cast<double>(c.batch.micro_sequences) > c.batch.sequences_per_gpu(w)) {
      char per_gpu[32];
      std::snprintf(per_gpu, sizeof per_gpu, "%g", c.batch.sequences_per_gpu(w));
      fail("batch.micro_sequences", std::to_string(c.batch.micro_sequences) + " exceeds the " + per_gpu +
                                        " sequences of one GPU at " + std::to_string(w) + " workers");
    }
  }
  return curve;
}

void parse_network(const Section& s, PredictConfig& c) {
  c.gpus_per_node = s.get("gpus_per_node").get<int>();
  c.nics_per_node = s.value_or("nics_per_node", c.gpus_per_node);
  if (c.nics_per_node > c.gpus_per_node) {
    fail(s.path("nics_per_node"),
         std::to_string(c.nics_per_node) + " is out of range [1, " + std::to_string(c.gpus_per_node) + "]");
  }
  c.inter = parse_link(s.object("inter"), "network.inter", inter_fields());
  c.intra = parse_link(s.object("intra"), "network.intra", intra_fields());
  const Section by_kind(s.object("collectives"), "network.collectives", collectives_fields());
  for (const auto kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
    if (!by_kind.has(to_string(kind))) continue;
    const Section link(by_kind.at(to_string(kind)), by_kind.path(to_string(kind)), measured_link_fields());
    link.require("alpha_us", "(a measured link gives both figures)");
    link.require("bandwidth_GBps", "(a measured link gives both figures)");
    c.collectives[static_cast<std::size_t>(kind)] =
        LinkSpec{"", link.at("alpha_us").get<double>(), link.at("bandwidth_GBps").get<double>()};
  }
  if (s.has("inter_curves")) {
    c.inter_curves =
        config::config_error([&] { return parse_inter_curves(s.at("inter_curves"), s.path("inter_curves")); });
  }
}

json link_json(const LinkSpec& l) {
  json j = {{"alpha_us", l.alpha_us}, {"bandwidth_GBps", l.bandwidth_GBps}};
  if (!l.preset.empty()) j["preset"] = l.preset;
  return j;
}

json optimizer_json(const OptimizerConfig& o) {
  config::ExperimentConfig run;
  run.optimizer = o;
  return run.to_json()["optimizer"];
}

}  // namespace

const char* to_string(Scaling s) { return s == Scaling::strong ? "strong" : "weak"; }

double BatchSpec::sequences_per_gpu(int workers) const {
  return scaling == Scaling::strong ? static_cast<double>(global_sequences) / workers
                                    : static_cast<double>(per_gpu_sequences);
}

NetworkModel LinkSpec::model() const { return presets::to_network_model(alpha_us, bandwidth_GBps); }

Topology PredictConfig::topology() const {
  Topology t{gpus_per_node, nics_per_node, intra.model(), inter.model(), {}, inter_curves};
  for (std::size_t k = 0; k < collectives.size(); ++k) {
    if (collectives[k]) t.inter_by_kind[k] = collectives[k]->model();
  }
  return t;
}

OptimizerConfig default_baseline(const OptimizerConfig& c) {
  if (c.type == OptimizerType::adamw || c.type == OptimizerType::adams) return c;
  OptimizerConfig b = c;
  b.type = c.inner == InnerRule::adamw ? OptimizerType::adamw : OptimizerType::adams;
  // fp8 is SCAPE's payload only (its error lives in the residual): the dense gradients go fp32.
  if (b.wire_dtype == WireType::fp8_e5m2) b.wire_dtype = WireType::fp32;
  return b;
}

PredictConfig parse_predict_config(const json& j) {
  const Section top(j, "", top_fields());
  PredictConfig c;
  c.name = top.get("name").get<std::string>();
  c.description = top.get("description").get<std::string>();
  c.workers = parse_workers(top);
  top.require("model", "(a model.preset or explicit dimensions)");
  const Section model(top.at("model"), "model", model_fields());
  c.model = parse_model(model, c.model_preset);
  c.attention = presets::parse_attention_flops(model.get("attention_flops").get<std::string>(), "");
  top.require("batch", "(batch.global_sequences or batch.per_gpu_sequences, and batch.seq_len)");
  c.batch = parse_batch(Section(top.at("batch"), "batch", batch_fields()), c);
  const Section gpu(top.object("gpu"), "gpu", gpu_fields());
  c.gpu = parse_gpu(gpu);
  c.gemm_curve = parse_compute_model(gpu, c);
  parse_network(Section(top.object("network"), "network", network_fields()), c);
  check_placement(c);
  c.overlap = parse_overlap(Section(top.object("overlap"), "overlap", overlap_fields()));
  c.optimizer = parse_optimizer_section(top.object("optimizer"), "optimizer");
  c.baseline = top.has("baseline") ? parse_optimizer_section(top.at("baseline"), "baseline")
                                   : default_baseline(c.optimizer);
  c.fill_in = top.get("fill_in").get<double>();
  c.hardware = top.value_or<std::string>("hardware", "");
  return c;
}

void merge_hardware(json& j, const std::filesystem::path& base_dir) {
  if (!j.is_object() || !j.contains("hardware") || !j.at("hardware").is_string()) return;
  const std::filesystem::path file = base_dir / j.at("hardware").get<std::string>();
  const json hw = config::read_json_file(file);
  if (!hw.is_object() || hw.value("format", "") != kHardwareFormat) {
    throw ConfigError("hardware: " + file.string() + " is not a hardware description (no \"format\": \"" +
                      kHardwareFormat + "\"; `scape predict --calibrate` writes one)");
  }
  for (const char* section : {"gpu", "network"}) {
    json merged = hw.value(section, json::object());
    if (j.contains(section) && j.at(section).is_object()) {
      json own = j.at(section);
      // A link the config gives is its own link: it replaces the description's fitted one (a
      // preset name merged into fitted figures would lose to them), and an inter-node link of its
      // own also drops the per-kind fits, which were fitted on the description's link.
      for (const char* link : {"inter", "intra"}) {
        if (own.contains(link)) merged.erase(link);
      }
      if (own.contains("inter") && !own.contains("collectives")) merged.erase("collectives");
      if (own.contains("inter") && !own.contains("inter_curves")) merged.erase("inter_curves");
      merged.merge_patch(own);
    } else if (j.contains(section)) {
      merged = j.at(section);  // not an object: the section's own parser names the error
    }
    j[section] = merged;
  }
}

json predict_schema() {
  using config::section_schema;
  json schema = section_schema(top_fields());
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "scape prediction";
  auto& p = schema["properties"];
  p["model"] = section_schema(model_fields());
  p["batch"] = section_schema(batch_fields());
  p["gpu"] = section_schema(gpu_fields());
  p["network"] = section_schema(network_fields());
  p["network"]["properties"]["inter"] = section_schema(inter_fields());
  p["network"]["properties"]["intra"] = section_schema(intra_fields());
  auto& by_kind = p["network"]["properties"]["collectives"];
  by_kind = section_schema(collectives_fields());
  for (const auto& f : collectives_fields()) by_kind["properties"][f.key] = section_schema(measured_link_fields());
  p["overlap"] = section_schema(overlap_fields());
  p["optimizer"] = config::experiment_schema()["properties"]["optimizer"];
  p["baseline"] = p["optimizer"];
  return schema;
}

PredictConfig load_predict_config(const std::filesystem::path& file, const std::vector<std::string>& sets) {
  json j = config::read_json_file(file);
  for (const auto& s : sets) config::apply_override(j, s);
  merge_hardware(j, std::filesystem::absolute(file).parent_path());
  return parse_predict_config(j);
}

json PredictConfig::to_json() const {
  json m = {{"family", presets::to_string(model.family)},
            {"n_layer", model.n_layer},
            {"n_embd", model.n_embd},
            {"n_head", model.n_head},
            {"n_kv_head", model.n_kv_head},
            {"ffn_hidden", model.ffn_hidden},
            {"vocab_size", model.vocab_size},
            {"context", model.context},
            {"tied_embeddings", model.tied_embeddings},
            {"attention_flops", presets::to_string(attention)}};
  if (!model_preset.empty()) m["preset"] = model_preset;
  json b = {{"scaling", predict::to_string(batch.scaling)}, {"seq_len", batch.seq_len}};
  if (batch.scaling == Scaling::strong) {
    b["global_sequences"] = batch.global_sequences;
  } else {
    b["per_gpu_sequences"] = batch.per_gpu_sequences;
  }
  if (batch.micro_sequences > 0) b["micro_sequences"] = batch.micro_sequences;
  json g = {{"peak_TFLOPs", gpu.peak_TFLOPs}, {"mfu", gpu.mfu}, {"memory_bandwidth_TBps", gpu.memory_TBps},
            {"host_link_GBps", gpu.host_link_GBps},
            {"mask_codec_Gcoords_per_s", gpu.mask_codec_Gcoords_per_s}};
  if (gpu.select_TBps > 0) g["select_TBps"] = gpu.select_TBps;
  if (gpu.pack_TBps > 0) g["pack_TBps"] = gpu.pack_TBps;
  g["compute_model"] = gemm_curve.fitted() ? "gemm" : "mfu";
  json net = {{"gpus_per_node", gpus_per_node}, {"nics_per_node", nics_per_node}, {"inter", link_json(inter)},
              {"intra", link_json(intra)}};
  for (const auto kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
    if (const auto& l = collectives[static_cast<std::size_t>(kind)])
      net["collectives"][to_string(kind)] = link_json(*l);
  }
  if (inter_curves) net["inter_curves"] = inter_curves_json(*inter_curves);
  if (!gpu.preset.empty()) g["preset"] = gpu.preset;
  json out = {{"name", name},
          {"description", description},
          {"model", m},
          {"batch", b},
          {"gpu", g},
          {"network", net},
          {"overlap",
           {{"grad_reduce", overlap.grad_reduce},
            {"param_gather", overlap.param_gather},
            {"sparse_reduce", overlap.sparse_reduce},
            {"mask_gather", overlap.mask_gather},
            {"bucket_MB", overlap.bucket_MB}}},
          {"optimizer", optimizer_json(optimizer)},
          {"baseline", optimizer_json(baseline)},
          {"fill_in", fill_in},
          {"workers", workers}};
  if (!hardware.empty()) out["hardware"] = hardware;  // its values are in gpu and network already
  return out;
}

}  // namespace scape::predict
