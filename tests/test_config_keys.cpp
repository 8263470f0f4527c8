// The config key tables as the outside sees them, through the JSON Schemas: docs list every
// key, the schema's defaults are the defaults a parsed config resolves to, and the resolved
// optimizer section keeps exactly the keys whose "x-applies-to" names its type.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "config/config.hpp"
#include "config/config_keys.hpp"
#include "predict/predict_config.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "test_support.hpp"

namespace cfg = scape::config;
using nlohmann::json;

namespace {

// Dotted keys of every property, objects and their members alike ("optimizer", "optimizer.lr").
void collect_keys(const json& schema, const std::string& prefix, std::vector<std::string>& out) {
  if (!schema.contains("properties")) return;
  for (const auto& [key, sub] : schema.at("properties").items()) {
    out.push_back(prefix + key);
    collect_keys(sub, prefix + key + ".", out);
  }
}

// The keys a Markdown doc names in the first cell of its table rows. "| `optimizer.lr`, `min_lr` |"
// names optimizer.lr and optimizer.min_lr: later names take the first one's section.
std::set<std::string> documented_keys(const std::string& file) {
  std::ifstream in(std::string(SCAPE_SOURCE_DIR) + "/" + file);
  REQUIRE(in);
  std::set<std::string> out;
  const std::regex name("`([A-Za-z_.]+)`");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string cell = line.substr(1, line.find('|', 1) - 1);
    std::string section;
    for (auto it = std::sregex_iterator(cell.begin(), cell.end(), name); it != std::sregex_iterator(); ++it) {
      std::string key = (*it)[1];
      if (section.empty()) {
        const auto dot = key.rfind('.');
        section = dot == std::string::npos ? "" : key.substr(0, dot + 1);
      } else if (key.find('.') == std::string::npos) {
        key = section + key;
      }
      out.insert(key);
    }
  }
  return out;
}

// Every key of the schema is named in the doc, itself or through the object holding it (an
// `optimizer` row stands for every optimizer key).
void check_documented(const json& schema, const std::string& file) {
  const auto documented = documented_keys(file);
  std::vector<std::string> keys;
  collect_keys(schema, "", keys);
  for (const auto& key : keys) {
    if (schema.at("properties").at(key.substr(0, key.find('.'))).value("type", "") == "object" &&
        key.find('.') == std::string::npos) {
      continue;  // a section: its members are what a reader looks up
    }
    bool found = false;
    for (std::string k = key; !found; k = k.substr(0, k.rfind('.'))) {
      found = documented.count(k) > 0;
      if (k.find('.') == std::string::npos) break;
    }
    CAPTURE(file);
    CAPTURE(key);
    CHECK(found);
  }
}

}  // namespace

TEST_CASE("docs/configuration.md lists every key of an experiment config") {
  check_documented(cfg::experiment_schema(), "docs/configuration.md");
}

TEST_CASE("docs/PREDICTING.md lists every key of a prediction config") {
  check_documented(scape::predict::predict_schema(), "docs/PREDICTING.md");
}

TEST_CASE("the schema's defaults are what a config that gives nothing resolves to") {
  const json resolved = cfg::parse_experiment(json::object(), ".").to_json();
  const json schema = cfg::experiment_schema();
  std::vector<std::string> keys;
  collect_keys(schema, "", keys);
  int checked = 0;
  for (const auto& key : keys) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) continue;
    const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
    const json& spec = schema["properties"][section]["properties"][name];
    // A section recorded only away from its defaults (topology) is absent from the resolved config.
    if (!spec.contains("default") || !resolved.contains(section) || !resolved[section].contains(name)) continue;
    CAPTURE(key);
    CHECK(resolved[section][name] == spec["default"]);
    ++checked;
  }
  CHECK(checked >= 25);
  CHECK(schema["properties"]["optimizer"]["properties"]["offload_chunk"]["default"] ==
        scape::OptimizerConfig{}.offload_chunk);
  CHECK(schema["properties"]["name"]["default"] == cfg::ExperimentConfig{}.name);
}

TEST_CASE("the resolved optimizer section keeps exactly the keys its type reads") {
  const json keys = cfg::experiment_schema()["properties"]["optimizer"]["properties"];
  for (const char* type : {"adamw", "adams", "scape", "topk_ef", "randk_ef"}) {
    CAPTURE(type);
    json config = {{"optimizer", {{"type", type}}}};
    if (std::string(type) == "topk_ef") config["optimizer"]["sharded"] = false;  // randk_ef: by default
    const json resolved = cfg::parse_experiment(config, ".").to_json()["optimizer"];
    for (const auto& [key, spec] : keys.items()) {
      const auto& types = spec.at("x-applies-to");
      CAPTURE(key);
      // overlap_grad_reduce is recorded only when true, hierarchy and rail_split only under hierarchy
      // "node", so that older run ids stay valid.
      const bool recorded_when_on = key == "overlap_grad_reduce" || key == "hierarchy" || key == "rail_split";
      CHECK(resolved.contains(key) ==
            (!recorded_when_on && std::find(types.begin(), types.end(), type) != types.end()));
    }
  }
  // Switched on, it is recorded (and so changes the run id) for the dense types only.
  for (const char* type : {"adamw", "adams"}) {
    CAPTURE(type);
    const json config = {{"optimizer", {{"type", type}, {"overlap_grad_reduce", true}}}};
    const json resolved = cfg::parse_experiment(config, ".").to_json();
    CHECK(resolved["optimizer"]["overlap_grad_reduce"] == true);
    const json off = cfg::parse_experiment({{"optimizer", {{"type", type}}}}, ".").to_json();
    CHECK(cfg::run_id(resolved) != cfg::run_id(off));
    CHECK(cfg::parse_experiment(resolved, ".").to_json() == resolved);  // the recorded config parses back
  }
  CHECK_THROWS_WITH_AS(cfg::parse_experiment({{"optimizer", {{"type", "scape"}, {"overlap_grad_reduce", true}}}}, "."),
                       doctest::Contains("overlap_grad_reduce"), cfg::ConfigError);
  CHECK_THROWS_WITH_AS(
      cfg::parse_experiment({{"optimizer", {{"type", "adamw"}, {"overlap_grad_reduce", true}, {"sharded", false}}}},
                            "."),
      doctest::Contains("optimizer.overlap_grad_reduce: buckets are reduce-scattered"), cfg::ConfigError);
  CHECK_THROWS_WITH_AS(
      cfg::parse_experiment({{"optimizer", {{"type", "adams"}, {"overlap_grad_reduce", true}, {"wire_dtype", "bf16"}}}},
                            "."),
      doctest::Contains("optimizer.overlap_grad_reduce: the buckets go at fp32"), cfg::ConfigError);
  CHECK_THROWS_WITH_AS(cfg::parse_experiment({{"optimizer", {{"type", "adams"}, {"overlap_grad_reduce", 1}}}}, "."),
                       doctest::Contains("optimizer.overlap_grad_reduce"), cfg::ConfigError);
}

// Run files carry the table the analysis needs (attribute optimizer_keys): the schema's
// "x-applies-to" of every optimizer key, so analysis/runs.py reads it from the file instead of
// asking `scape schema`.
TEST_CASE("a fresh run file's optimizer_keys attribute is the schema's x-applies-to of every optimizer key") {
  const json keys = cfg::experiment_schema()["properties"]["optimizer"]["properties"];
  scape::testing::TempDir dir;
  scape::train::RunOptions options;
  options.out = dir / "keys.h5";
  options.quiet = true;
  const json config = {{"workers", 2}, {"steps", 2}, {"model", {{"type", "quadratic"}, {"size", 256}}},
                       {"optimizer", {{"type", "adams"}}}};
  REQUIRE(scape::sim::run_simulated(cfg::parse_experiment(config, "."), options).status ==
          scape::train::RunStatus::completed);
  const auto file = scape::run_file::File::open(options.out, scape::run_file::Access::read);
  REQUIRE(file.has_attribute("optimizer_keys"));
  const json stored = json::parse(file.read_string_attribute("optimizer_keys"));
  REQUIRE(stored.is_object());
  CHECK(stored.size() == keys.size());
  for (const auto& [key, spec] : keys.items()) {
    CAPTURE(key);
    REQUIRE(stored.contains(key));
    CHECK(stored[key] == spec.at("x-applies-to"));
  }
  CHECK(stored == cfg::optimizer_key_types());
}

TEST_CASE("the prediction schema shares the optimizer keys and states the fixed defaults") {
  const json schema = scape::predict::predict_schema();
  const json& p = schema["properties"];
  CHECK(p["optimizer"] == cfg::experiment_schema()["properties"]["optimizer"]);
  CHECK(p["baseline"] == p["optimizer"]);
  const json config = {{"workers", {1, 2}}, {"model", {{"preset", "gpt2-124m"}}}, {"batch", {{"global_sequences", 8}}}};
  const json resolved = scape::predict::parse_predict_config(config).to_json();
  for (const char* section : {"gpu", "overlap", "batch", "model"}) {
    for (const auto& [key, spec] : p[section]["properties"].items()) {
      if (!spec.contains("default")) continue;
      CAPTURE(section);
      CAPTURE(key);
      CHECK(resolved[section][key] == spec["default"]);
    }
  }
  CHECK(resolved["network"]["inter"]["preset"] == p["network"]["properties"]["inter"]["properties"]["preset"]["default"]);
  CHECK(resolved["network"]["intra"]["preset"] == p["network"]["properties"]["intra"]["properties"]["preset"]["default"]);
  CHECK(resolved["fill_in"] == p["fill_in"]["default"]);
  CHECK(resolved["name"] == p["name"]["default"]);
}

TEST_CASE("predict and experiment configs share one strict section parser") {
  json config = {{"workers", {1}}, {"model", {{"preset", "gpt2-124m"}}}, {"batch", {{"global_sequences", 8}}},
                 {"overlap", {{"bucket_mb", 25}}}};
  CHECK_THROWS_WITH_AS(scape::predict::parse_predict_config(config),
                       doctest::Contains("overlap.bucket_mb: unknown key (did you mean 'bucket_MB'?)"),
                       cfg::ConfigError);
  config = {{"log", {{"flush_intervall", 3}}}};
  CHECK_THROWS_WITH_AS(cfg::parse_experiment(config, "."),
                       doctest::Contains("log.flush_intervall: unknown key (did you mean 'flush_interval'?)"),
                       cfg::ConfigError);
}

TEST_CASE("device: absent means cpu (run ids unchanged); cuda moves the optimizer with the model") {
  const json gpt = {{"model", {{"type", "gpt"}}}, {"optimizer", {{"type", "scape"}}}};
  json on_cpu = gpt;
  on_cpu["device"] = "cpu";
  const json resolved = cfg::parse_experiment(gpt, ".").to_json();
  CHECK_FALSE(resolved.contains("device"));
  CHECK(cfg::run_id(cfg::parse_experiment(on_cpu, ".").to_json()) == cfg::run_id(resolved));

  for (const char* type : {"scape", "adams", "adamw"}) {
    CAPTURE(type);
    json on_gpu = gpt;
    on_gpu["device"] = "cuda";
    on_gpu["optimizer"]["type"] = type;
    const auto c = cfg::parse_experiment(on_gpu, ".");  // parsing checks no hardware
    CHECK(c.device == scape::kernels::DeviceKind::cuda);
    CHECK(c.optimizer.device == scape::kernels::DeviceKind::cuda);
    const json recorded = c.to_json();
    CHECK(recorded["device"] == "cuda");
    CHECK(cfg::run_id(recorded) != cfg::run_id(resolved));
    // The recorded config parses back to the same placement and id.
    const auto again = cfg::parse_experiment(recorded, ".");
    CHECK(again.optimizer.device == scape::kernels::DeviceKind::cuda);
    CHECK(cfg::run_id(again.to_json()) == cfg::run_id(recorded));
  }
  // A host model with the SCAPE optimizer alone on the GPU stays possible.
  json split = gpt;
  split["optimizer"]["device"] = "cuda";
  const auto c = cfg::parse_experiment(split, ".");
  CHECK(c.device == scape::kernels::DeviceKind::cpu);
  CHECK(c.optimizer.device == scape::kernels::DeviceKind::cuda);
}

TEST_CASE("topology and hierarchy: absent or flat leaves the resolved config (and run ids) as before") {
  json flat = {{"workers", 4}, {"optimizer", {{"type", "scape"}}}};
  const json before = cfg::parse_experiment(flat, ".").to_json();
  flat["topology"]["ranks_per_node"] = 1;
  flat["optimizer"]["hierarchy"] = "flat";
  flat["optimizer"]["rail_split"] = "rows";
  CHECK_THROWS_WITH_AS(cfg::parse_experiment(flat, "."), doctest::Contains("optimizer.rail_split"),
                       cfg::ConfigError);  // a split without hierarchy node would be dropped unseen
  flat["optimizer"]["rail_split"] = "tensors";
  const json resolved = cfg::parse_experiment(flat, ".").to_json();
  CHECK(resolved == before);
  CHECK_FALSE(resolved.contains("topology"));
  CHECK_FALSE(resolved["optimizer"].contains("hierarchy"));
  json node = flat;
  node["topology"]["ranks_per_node"] = 2;
  node["optimizer"]["hierarchy"] = "node";
  node["optimizer"]["rail_split"] = "rows";
  const json recorded = cfg::parse_experiment(node, ".").to_json();
  CHECK(recorded["topology"]["ranks_per_node"] == 2);
  CHECK(recorded["optimizer"]["hierarchy"] == "node");
  CHECK(recorded["optimizer"]["rail_split"] == "rows");
  const auto again = cfg::parse_experiment(recorded, ".");
  CHECK(again.optimizer.ranks_per_node == 2);
  CHECK(again.optimizer.hierarchy == scape::Hierarchy::node);
  CHECK(again.optimizer.rail_split == scape::RailSplit::rows);
  CHECK(cfg::run_id(recorded) != cfg::run_id(before));
  CHECK_FALSE(recorded["network"].contains("intra"));
  CHECK_FALSE(again.optimizer.node_link.has_value());
  CHECK(again.world_link_class() == scape::LinkClass::inter);
  // network.intra: the node's link, recorded when given; a world of one node is charged to it.
  node["network"]["intra"] = "nvlink_h100";
  node["workers"] = 2;
  const auto one_node = cfg::parse_experiment(node, ".");
  CHECK(one_node.to_json()["network"]["intra"] == "nvlink_h100");
  REQUIRE(one_node.optimizer.node_link.has_value());
  CHECK(one_node.optimizer.node_link->bandwidth_Bps == 450e9);
  CHECK(one_node.world_link_class() == scape::LinkClass::intra);
  CHECK(one_node.world_link().bandwidth_Bps == 450e9);
  node["workers"] = 4;
  CHECK(cfg::parse_experiment(node, ".").world_link().bandwidth_Bps == 50e9);  // ib_ndr400 between nodes
  node["workers"] = 2;
  node["optimizer"]["type"] = "adamw";
  CHECK_THROWS_WITH_AS(cfg::parse_experiment(node, "."),
                       doctest::Contains("optimizer.hierarchy: \"node\" is built for scape, adams and diloco"),
                       cfg::ConfigError);
  node["optimizer"]["type"] = "scape";
  node["workers"] = 3;
  CHECK_THROWS_WITH_AS(cfg::parse_experiment(node, "."),
                       doctest::Contains("topology.ranks_per_node: 2 does not divide workers = 3"), cfg::ConfigError);
}

TEST_CASE("model.precision: absent means fp32 (run ids unchanged); bf16 is recorded and parses back") {
  const json gpt = {{"model", {{"type", "gpt"}}}};
  json fp32 = gpt, bf16 = gpt;
  fp32["model"]["precision"] = "fp32";
  bf16["model"]["precision"] = "bf16";
  const json resolved = cfg::parse_experiment(gpt, ".").to_json();
  CHECK_FALSE(resolved["model"].contains("precision"));
  CHECK(cfg::run_id(cfg::parse_experiment(fp32, ".").to_json()) == cfg::run_id(resolved));
  const json recorded = cfg::parse_experiment(bf16, ".").to_json();
  CHECK(recorded["model"]["precision"] == "bf16");
  CHECK(cfg::run_id(recorded) != cfg::run_id(resolved));
  CHECK(cfg::parse_experiment(recorded, ".").model.precision == "bf16");
  json quadratic = {{"model", {{"type", "quadratic"}, {"precision", "bf16"}}}};
  CHECK_THROWS_WITH_AS(cfg::parse_experiment(quadratic, "."), doctest::Contains("model.precision"), cfg::ConfigError);
}

TEST_CASE("every shipped run and sweep config under experiments/configs parses, every sweep point included") {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(SCAPE_SOURCE_DIR) / "experiments/configs";
  int files = 0, points = 0, skipped = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const fs::path& file = entry.path();
    if (file.extension() != ".json" || file.parent_path().filename() == "predict") continue;
    CAPTURE(file.string());
    const json j = cfg::read_json_file(file);
    const bool sweep = j.contains("base") || j.contains("base_file");
    std::vector<json> configs;
    if (sweep) {
      for (const auto& p : cfg::expand_sweep(j, file.parent_path())) configs.push_back(p.config);
    } else {
      configs.push_back(j);
    }
    // A config on the shared test corpus parses only where ../shared/data is present.
    const auto& first = configs.front();
    if (first.contains("data") && first["data"].contains("path") &&
        !fs::exists(file.parent_path() / first["data"]["path"].get<std::string>())) {
      MESSAGE("skipped (its data file is absent here): " << file.string());
      ++skipped;
      continue;
    }
    for (const auto& c : configs) CHECK_NOTHROW(cfg::parse_experiment(c, file.parent_path()));
    ++files;
    points += static_cast<int>(configs.size());
  }
  MESSAGE(files << " configs, " << points << " runs parsed, " << skipped << " skipped");
  CHECK(files + skipped >= 14);  // the quickstart, its run, two calibration runs, the eleven paper sweeps
}

TEST_CASE("backend defaults: mpi and nccl turn the rank-0 diagnostics down; the simulator's config is untouched") {
  const std::string path = std::string(SCAPE_SOURCE_DIR) + "/experiments/configs/quickstart-run.json";
  const json file = cfg::read_json_file(path);
  json sim = file;
  cfg::apply_backend_defaults(sim, "sim");
  CHECK(sim == file);
  // The simulator's run id, pinned: the run files of earlier scape versions stay this config's.
  const auto sim_config = cfg::parse_experiment(sim, ".");
  CHECK(cfg::run_id(sim_config.to_json()) == "46e127c99d6414c6");
  CHECK(sim_config.log.oracle);
  CHECK(sim_config.log.gradient_metrics_interval == 1);
  for (const char* backend : {"mpi", "nccl"}) {
    CAPTURE(std::string(backend));
    json multi = file;
    cfg::apply_backend_defaults(multi, backend);
    const auto c = cfg::parse_experiment(multi, ".");
    CHECK_FALSE(c.log.oracle);
    CHECK(c.log.gradient_metrics_interval == cfg::kMultiProcessGradientMetricsInterval);
    // The resolved config records what runs.
    const json recorded = c.to_json();
    CHECK(recorded["log"]["oracle"] == false);
    CHECK(recorded["log"]["gradient_metrics_interval"] == 100);
    CHECK(cfg::run_id(recorded) != cfg::run_id(sim_config.to_json()));
    // Keys the config gives are kept, and a recorded config resolves to itself.
    json asked = file;
    asked["log"]["oracle"] = true;
    asked["log"]["gradient_metrics_interval"] = 1;
    cfg::apply_backend_defaults(asked, backend);
    CHECK(cfg::run_id(cfg::parse_experiment(asked, ".").to_json()) == cfg::run_id(sim_config.to_json()));
    json again = recorded;
    cfg::apply_backend_defaults(again, backend);
    CHECK(cfg::parse_experiment(again, ".").to_json() == recorded);
  }
  // A config without a log section gets one; a wrong type is left for the parser to name.
  json bare = {{"model", {{"type", "quadratic"}}}};
  cfg::apply_backend_defaults(bare, "mpi");
  CHECK(bare["log"] == json{{"oracle", false}, {"gradient_metrics_interval", 100}});
  json wrong = {{"log", 3}};
  cfg::apply_backend_defaults(wrong, "mpi");
  CHECK(wrong["log"] == 3);
}
