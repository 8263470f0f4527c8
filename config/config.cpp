// Experiment configs: the sections parsed with their key tables (config/config_keys.cpp),
// the checks that span keys, the resolved config and its run id, and the JSON Schema.
#include "config/config.hpp"

#include <cstdio>

#include "config/config_keys.hpp"
#include "config/model_shapes.hpp"
#include "presets/network_presets.hpp"
#include "util/fnv1a.hpp"

namespace scape::config {
namespace {

using nlohmann::json;

const json kEmpty = json::object();

const json& section_json(const json& j, const char* key) { return j.contains(key) ? j.at(key) : kEmpty; }

ModelSection parse_model(const json& j) {
  const Section s(j, "model", model_keys().fields);
  ModelSection m;
  write_given(s, model_keys(), m);
  check_applicable(s, model_keys(), m.type);
  const bool transformer = m.type == "gpt" || m.type == "llama";
  if (transformer && m.n_embd % m.n_head != 0) {
    fail("model.n_head", std::to_string(m.n_head) + " does not divide model.n_embd = " + std::to_string(m.n_embd));
  }
  if (m.type == "llama" && (m.n_embd / m.n_head) % 2 != 0) {
    fail("model.n_embd", std::to_string(m.n_embd) + " / model.n_head = " + std::to_string(m.n_embd / m.n_head) +
                             " is an odd head dimension; RoPE rotates pairs and needs it even");
  }
  if (m.type == "llama" && m.n_kv_head != 0 && m.n_head % m.n_kv_head != 0) {
    fail("model.n_kv_head",
         std::to_string(m.n_kv_head) + " does not divide model.n_head = " + std::to_string(m.n_head));
  }
  return m;
}

DataSection parse_data(const json& j, const std::filesystem::path& base_dir) {
  const Section s(j, "data", data_keys().fields);
  DataSection d;
  write_given(s, data_keys(), d);
  check_applicable(s, data_keys(), d.type);
  if (s.has("path")) d.path = resolve_path(d.path.string(), base_dir);
  return d;
}

// The optimizer runs where the model does (the top-level `device`) unless optimizer.device says
// otherwise; a CPU optimizer cannot step parameters that live on the GPU.
OptimizerConfig parse_optimizer(const json& j, std::uint64_t seed, kernels::DeviceKind model_device,
                                int ranks_per_node) {
  const Section s(j, "optimizer", optimizer_keys().fields);
  OptimizerConfig c;
  write_given(s, optimizer_keys(), c);
  c.ranks_per_node = ranks_per_node;
  const std::string type = to_string(c.type);
  if (!s.has("device")) {
    c.device = model_device;
  } else if (c.type != OptimizerType::scape && c.device != kernels::DeviceKind::cpu) {
    fail("optimizer.device", "placing the optimizer alone on the GPU is a SCAPE switch; " + type +
                                 " runs on the GPU with its model: set the top-level device = \"cuda\"");
  }
  if (model_device == kernels::DeviceKind::cuda && c.device != kernels::DeviceKind::cuda) {
    fail("optimizer.device", std::string("\"") + kernels::to_string(c.device) +
                                 "\" cannot step parameters that live on the GPU (device \"cuda\"); leave it out or "
                                 "set it to \"cuda\"");
  }
  if (c.device == kernels::DeviceKind::cuda && !runs_on_cuda(c.type)) {
    fail("device", "\"cuda\" runs the optimizer types scape, adamw and adams; " + type + " runs on the cpu only");
  }
  if (!s.has("sharded")) c.sharded = !replicated_only(c.type);  // the EF baselines keep replicated state
  // Whole shards count k over every element, so the default keeps no tensor dense there.
  if (!s.has("dense_tensors") && c.scape.mask_scope == MaskScope::shard) c.scape.dense_tensors.clear();
  c.seed = seed;
  config_error([&] { c.validate(); });
  // Switches this type does not read are left out of the resolved config, but a value out of
  // their range is still a mistake: check them as SCAPE, which reads them all, would.
  OptimizerConfig as_scape = c;
  as_scape.type = OptimizerType::scape;
  as_scape.scape.mask_partition = MaskPartition::partitioned;  // no cross-key rule of local_union applies
  as_scape.overlap_grad_reduce = false;                        // a dense switch, checked above
  config_error([&] { as_scape.validate(); });
  return c;
}

NetworkSection parse_network(const json& j) {
  const Section s(j, "network", network_keys().fields);
  NetworkSection n;
  write_given(s, network_keys(), n);
  if (!n.intra.empty()) config_error([&] { (void)presets::find_network_preset(n.intra, "network.intra"); });
  const bool explicit_link = s.has("alpha_us") && s.has("bandwidth_GBps");
  if (!s.has("preset") && (s.has("alpha_us") != s.has("bandwidth_GBps"))) {
    fail(s.has("alpha_us") ? "network.bandwidth_GBps" : "network.alpha_us",
         "required with the other link figure when no preset is named");
  }
  if (!s.has("preset") && explicit_link) {
    n.preset = "";
    return n;
  }
  const auto& p = config_error(
      [&]() -> const presets::NetworkPreset& { return presets::find_network_preset(n.preset, "network.preset"); });
  if (!s.has("alpha_us")) n.alpha_us = p.alpha_us;
  if (!s.has("bandwidth_GBps")) n.bandwidth_GBps = p.bandwidth_GBps;
  return n;
}

// W = nodes x G: G must divide the workers.
TopologySection parse_topology(const json& j, int workers) {
  const Section s(j, "topology", topology_keys().fields);
  TopologySection t;
  write_given(s, topology_keys(), t);
  if (workers % t.ranks_per_node != 0) {
    fail("topology.ranks_per_node", std::to_string(t.ranks_per_node) + " does not divide workers = " +
                                        std::to_string(workers) + " (W = nodes x ranks_per_node)");
  }
  return t;
}

// optimizer.rail_split = "tensors" deals whole tensors to the G rails, so it needs G tensors:
// checked here where the config alone gives the layout (the quadratic's one tensor, a language
// model's shape); a trace's layout is checked when the optimizer is made.
void check_rails(const ExperimentConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  if (o.hierarchy != Hierarchy::node || o.rail_split != RailSplit::tensors) return;
  std::size_t tensors = 0;
  if (c.model.type == "quadratic") {
    tensors = 1;
  } else if (c.has_data()) {
    tensors = language_model_spec(c.model).layout().slots().size();
  }
  if (tensors > 0 && tensors < static_cast<std::size_t>(o.ranks_per_node)) {
    fail("optimizer.rail_split",
         "\"tensors\" deals whole tensors to topology.ranks_per_node = " + std::to_string(o.ranks_per_node) +
             " rails, and model.type \"" + c.model.type + "\" has " + std::to_string(tensors) + "; use \"rows\"");
  }
}

ComputeSection parse_compute(const json& j, const ModelSection& model) {
  const Section s(j, "compute", compute_keys().fields);
  ComputeSection c;
  write_given(s, compute_keys(), c);
  check_applicable(s, compute_keys(), c.type);
  if (c.type == "sleep" && !s.has("seconds")) {
    fail("compute.seconds", "compute.type \"sleep\" needs the seconds of forward and backward a step stands for");
  }
  if (c.type == "flops" && model.type != "gpt") {
    fail("compute.type",
         "\"flops\" needs model.type \"gpt\" (the FLOPs come from the gpt shape), got \"" + model.type + "\"");
  }
  return c;
}

}  // namespace

NetworkModel NetworkSection::model() const { return presets::to_network_model(alpha_us, bandwidth_GBps); }

NetworkModel NetworkSection::intra_model() const {
  if (intra.empty()) return model();
  const auto& p = presets::find_network_preset(intra, "network.intra");
  return presets::to_network_model(p.alpha_us, p.bandwidth_GBps);
}

LinkClass ExperimentConfig::world_link_class() const {
  const int g = topology.ranks_per_node;
  return g > 1 && workers == g ? LinkClass::intra : LinkClass::inter;
}

NetworkModel ExperimentConfig::world_link() const {
  return world_link_class() == LinkClass::intra ? network.intra_model() : network.model();
}

std::filesystem::path resolve_path(const std::string& p, const std::filesystem::path& base_dir) {
  std::filesystem::path path(p);
  if (path.is_relative()) path = base_dir / path;
  return path.lexically_normal();
}

namespace {

// The name becomes a file name (NAME.h5 without --out, a sweep point's file in --out): a path
// out of the folder, a hidden file or a folder that does not exist would be written silently.
void check_name(const std::string& name) {
  if (name.empty()) fail("name", "is empty; it names the run's files");
  if (name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
    fail("name", "\"" + name + "\" is not a plain file name (no '/', not '.' or '..'); it names the run's files");
}

}  // namespace

ExperimentConfig parse_experiment(const json& j, const std::filesystem::path& base_dir) {
  const Section top(j, "", top_keys().fields);
  ExperimentConfig c;
  write_given(top, top_keys(), c);
  check_name(c.name);
  c.model = parse_model(section_json(j, "model"));
  if (c.device == kernels::DeviceKind::cuda && !c.has_data()) {
    fail("device",
         "\"cuda\" places a language model on the GPU; model.type \"" + c.model.type +
             "\" computes its gradients on the host (optimizer.device \"cuda\" runs only the optimizer there)");
  }
  if (c.has_data()) {
    c.data = parse_data(section_json(j, "data"), base_dir);
  } else {
    top.forbid("data", "model.type \"" + c.model.type + "\" takes no data section");
  }
  if (c.has_eval()) {
    const Section eval(section_json(j, "eval"), "eval", eval_keys().fields);
    write_given(eval, eval_keys(), c.eval);
  } else {
    top.forbid("eval", "model.type \"" + c.model.type + "\" has no validation loss; remove the eval section");
  }
  if (c.model.type == "replay") c.model.path = resolve_path(c.model.path.string(), base_dir);
  c.topology = parse_topology(section_json(j, "topology"), c.workers);
  c.optimizer = parse_optimizer(section_json(j, "optimizer"), c.seed, c.device, c.topology.ranks_per_node);
  c.network = parse_network(section_json(j, "network"));
  if (!c.network.intra.empty()) c.optimizer.node_link = c.network.intra_model();
  check_rails(c);
  c.compute = parse_compute(section_json(j, "compute"), c.model);
  const Section log(section_json(j, "log"), "log", log_keys().fields);
  write_given(log, log_keys(), c.log);
  return c;
}

json ExperimentConfig::to_json() const {
  json j = read_applicable(top_keys(), *this);
  // Absent means "cpu": configs written before the key existed keep their run ids.
  if (device == kernels::DeviceKind::cpu) j.erase("device");
  j["model"] = read_applicable(model_keys(), model, model.type);
  if (model.precision == "fp32") j["model"].erase("precision");  // as device: earlier run ids hold
  if (has_data()) j["data"] = read_applicable(data_keys(), data, data.type);
  if (has_eval()) j["eval"] = read_applicable(eval_keys(), eval);
  // Switches the optimizer type never reads are left out (as model and data keys of other
  // types are), so configs that train identically share one run id: the dense point of a
  // sweep over sparsity runs once.
  j["optimizer"] = read_applicable(optimizer_keys(), optimizer, to_string(optimizer.type));
  // Absent while G = 1, as device: earlier run ids hold.
  if (topology.ranks_per_node != 1) j["topology"] = read_applicable(topology_keys(), topology);
  j["network"] = read_applicable(network_keys(), network);
  if (network.preset.empty()) j["network"].erase("preset");
  if (network.intra.empty()) j["network"].erase("intra");  // as device: earlier run ids hold
  j["compute"] = read_applicable(compute_keys(), compute, compute.type);
  j["log"] = read_applicable(log_keys(), log);
  if (log.gradient_metrics_interval == 1) j["log"].erase("gradient_metrics_interval");  // as device
  return j;
}

bool is_multi_process_backend(std::string_view backend) { return backend == "mpi" || backend == "nccl"; }

void apply_backend_defaults(json& j, std::string_view backend) {
  if (!is_multi_process_backend(backend) || !j.is_object()) return;
  json& log = j["log"];
  if (log.is_null()) log = json::object();
  if (!log.is_object()) return;  // parse_experiment names the wrong type
  if (!log.contains("oracle")) log["oracle"] = false;
  if (!log.contains("gradient_metrics_interval"))
    log["gradient_metrics_interval"] = kMultiProcessGradientMetricsInterval;
}

void check_backend(const ExperimentConfig& config, std::string_view backend) {
  // NCCL's node and rail groups (ncclCommSplit) are compiled but have never run on a GPU, and a
  // hierarchical optimizer refuses the GPU (optimizer.device = "cuda") for now.
  if (backend == "nccl" && config.optimizer.hierarchy == Hierarchy::node) {
    fail("optimizer.hierarchy",
         "\"node\" runs in the simulator and over MPI (--backend sim or mpi); over nccl "
         "it has not run on a GPU yet");
  }
}

std::string run_id(const json& resolved) {
  // FNV-1a over the canonical dump (nlohmann sorts object keys), then a final mix.
  std::uint64_t h = fnv1a_64(resolved.dump(), kRunIdOffset);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

json experiment_schema() {
  json schema = section_schema(top_keys().fields);
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "scape experiment";
  auto& p = schema["properties"];
  p["model"] = section_schema(model_keys().fields, "type");
  p["data"] = section_schema(data_keys().fields, "type");
  p["optimizer"] = section_schema(optimizer_keys().fields, "type");
  p["topology"] = section_schema(topology_keys().fields);
  p["network"] = section_schema(network_keys().fields);
  p["compute"] = section_schema(compute_keys().fields, "type");
  p["eval"] = section_schema(eval_keys().fields);
  p["log"] = section_schema(log_keys().fields);
  return schema;
}

}  // namespace scape::config
