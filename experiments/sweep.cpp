// Reading config files, --set overrides and sweep expansion: the JSON edits made before a
// config is parsed.
#include <fstream>

#include "experiments/config.hpp"

namespace scape::experiments {

using nlohmann::json;

// A sweep beyond this is a typo (a grid of many keys), not a plan: refused before its points
// exhaust the memory.
constexpr std::size_t kMaxSweepPoints = 100000;

json read_json_file(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) throw ConfigError(path.string() + ": is a directory, expected a JSON file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot open the file");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number beyond double
    throw ConfigError(path.string() + ": invalid JSON: " + e.what());
  }
}

void apply_override(json& j, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("--set " + assignment + ": expected key.path=value");
  }
  // Config values become JSON strings, which must be UTF-8 (every later dump would throw).
  try {
    (void)json(assignment).dump();
  } catch (const json::type_error&) {
    throw ConfigError("--set " + json(assignment).dump(-1, ' ', false, json::error_handler_t::replace) +
                      ": not valid UTF-8");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::exception&) {  // parse_error, or out_of_range for a number beyond double
    value = text;  // not JSON: a plain string such as scape or first_moment
  }
  json* node = &j;
  std::size_t start = 0;
  while (true) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError("--set " + assignment + ": empty component in key '" + key + "'");
    if (!node->is_object()) throw ConfigError("--set " + assignment + ": '" + key.substr(0, start - 1) + "' is not an object");
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    node = &(*node)[part];
    if (node->is_null()) *node = json::object();
    start = dot + 1;
  }
}

std::vector<SweepPoint> expand_sweep(const json& sweep, const std::filesystem::path& base_dir) {
  if (!sweep.is_object()) throw ConfigError("sweep: expected an object with base or base_file, and grid");
  for (const auto& [key, value] : sweep.items()) {
    if (key != "base" && key != "base_file" && key != "grid" && key != "points" && key != "description" &&
        key != "name") {
      throw ConfigError("sweep." + key + ": unknown key; valid keys: name, description, base, base_file, grid, points");
    }
  }
  if (sweep.contains("base") == sweep.contains("base_file")) {
    throw ConfigError("sweep: give exactly one of base and base_file");
  }
  if (sweep.contains("base_file") && !sweep.at("base_file").is_string())
    throw ConfigError("sweep.base_file: expected a file name, got " + type_name(sweep.at("base_file")));
  json base = sweep.contains("base") ? sweep.at("base")
                                     : read_json_file(resolve_path(sweep.at("base_file").get<std::string>(), base_dir));
  if (!sweep.contains("grid") && !sweep.contains("points")) {
    throw ConfigError("sweep: give a grid {\"dotted.key\": [values, ...]} and/or points [{\"dotted.key\": value}, ...]");
  }
  if (sweep.contains("grid") && !sweep.at("grid").is_object()) {
    throw ConfigError("sweep.grid: expected an object {\"dotted.key\": [values, ...]}");
  }
  std::vector<SweepPoint> points{{base, {}}};
  if (sweep.contains("points")) {
    const json& list = sweep.at("points");
    if (!list.is_array() || list.empty()) throw ConfigError("sweep.points: expected a non-empty array of objects");
    std::vector<SweepPoint> expanded;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_object()) throw ConfigError("sweep.points[" + std::to_string(i) + "]: expected an object");
      SweepPoint q{base, {}};
      for (const auto& [key, value] : list[i].items()) {
        apply_override(q.config, key + "=" + value.dump());
        q.assignment.emplace_back(key, value);
      }
      expanded.push_back(std::move(q));
    }
    points = std::move(expanded);
  }
  const json no_grid = json::object();
  for (const auto& [key, values] : (sweep.contains("grid") ? sweep.at("grid") : no_grid).items()) {
    if (!values.is_array() || values.empty()) throw ConfigError("sweep.grid." + key + ": expected a non-empty array of values");
    if (points.size() * values.size() > kMaxSweepPoints)
      throw ConfigError("sweep.grid." + key + ": the sweep would expand to " + std::to_string(points.size()) + " x " +
                        std::to_string(values.size()) + " points, more than " + std::to_string(kMaxSweepPoints) +
                        "; split it into several sweeps");
    std::vector<SweepPoint> next;
    for (const auto& p : points) {
      for (const auto& v : values) {
        SweepPoint q = p;
        apply_override(q.config, key + "=" + v.dump());
        q.assignment.emplace_back(key, v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  return points;
}

}  // namespace scape::experiments
