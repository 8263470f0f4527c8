// Reading config files, --set overrides and sweep expansion: the JSON edits made before a
// config is parsed.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/json_section.hpp"

namespace scape::config {

using nlohmann::json;

// A sweep beyond this is a typo (a grid of many keys), not a plan: refused before its points
// exhaust the memory.
constexpr std::size_t kMaxSweepPoints = 100000;

namespace {

// A parser callback that refuses an object naming a key twice: nlohmann keeps the last value
// silently, so `"lr": 0.1, ..., "lr": 0.01` would run with a value the author may not see.
// Throws ConfigError "<what>: duplicate key 'a.b[2].c'", and for a value nested deeper than
// kMaxDepth levels.
class DuplicateKeyCheck {
 public:
  static constexpr std::size_t kMaxDepth = 256;
  // `prefix`: the dotted key the parsed value goes to (a --set value), named before its own keys.
  explicit DuplicateKeyCheck(std::string what, std::string prefix = "")
      : what_(std::move(what)), prefix_(std::move(prefix)) {}
  bool operator()(int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // Deeper values would be dumped into error messages recursively, which overflows the
        // stack (a crash, not an error) near 100000 levels; a config is a few levels deep.
        if (frames_.size() >= kMaxDepth)
          throw ConfigError(what_ + ": nested deeper than " + std::to_string(kMaxDepth) + " levels at '" +
                            path().substr(0, 200) + "...' (a config is a few levels deep)");
        frames_.push_back({event == json::parse_event_t::object_start, {}, {}, 0});
        break;
      case json::parse_event_t::key: {
        Frame& top = frames_.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second)
          throw ConfigError(what_ + ": duplicate key '" + path() + "' (an object names it twice; give it once)");
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: frames_.pop_back(); [[fallthrough]];
      case json::parse_event_t::value:
        if (!frames_.empty() && !frames_.back().object) ++frames_.back().elements;
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;       // an object's key being read
    std::size_t elements;  // an array's elements read
  };
  std::string path() const {
    std::string p = prefix_;
    for (const Frame& f : frames_) {
      if (f.object) {
        p += (p.empty() ? "" : ".") + f.key;
      } else {
        p += "[" + std::to_string(f.elements) + "]";
      }
    }
    return p;
  }
  std::string what_, prefix_;
  std::vector<Frame> frames_;
};

}  // namespace

json read_json_file(const std::filesystem::path& path) {
  // The error_code forms: a name the system refuses (too long, say) is a ConfigError like a
  // missing file, not a filesystem_error thrown past the caller.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(path.string() + ": is a directory, expected a JSON file");
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(path.string() + ": cannot open the file" + (ec ? " (" + ec.message() + ")" : std::string()));
  }
  try {
    return json::parse(in, DuplicateKeyCheck(path.string()));
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
    value = json::parse(text, DuplicateKeyCheck("--set " + assignment, key));
  } catch (const json::out_of_range&) {  // a number beyond double, which read as a string
    throw ConfigError("--set " + assignment + ": the number " + text + " is beyond the range of a double");
  } catch (const json::exception&) {  // parse_error: not JSON, a plain string such as scape
    value = text;
  }
  set_dotted(j, key, value, "--set " + assignment);
}

void set_dotted(json& j, const std::string& key, const json& value, const std::string& where) {
  json* node = &j;
  std::size_t start = 0;
  while (true) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError(where + ": empty component in key '" + key + "'");
    if (!node->is_object()) {
      throw ConfigError(where + ": '" + (start == 0 ? std::string("the config") : key.substr(0, start - 1)) +
                        "' is not an object");
    }
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    node = &(*node)[part];
    if (node->is_null()) *node = json::object();
    start = dot + 1;
  }
}

namespace {

constexpr int kMaxRepeat = 1000;

// One sweep point on its way through the expansion, with the learning rates it is searched at
// (the sweep's lr_search, or its point's own; null when none applies).
struct PendingPoint {
  SweepPoint point;
  const json* lr_search = nullptr;
};

void check_top_keys(const json& sweep) {
  if (!sweep.is_object()) throw ConfigError("sweep: expected an object with base or base_file, and grid");
  for (const auto& [key, value] : sweep.items()) {
    if (key != "base" && key != "base_file" && key != "grid" && key != "points" && key != "description" &&
        key != "name" && key != "repeat" && key != "lr_search") {
      throw ConfigError("sweep." + key +
                        ": unknown key; valid keys: name, description, base, base_file, grid, points, repeat, "
                        "lr_search");
    }
  }
  if (sweep.contains("base") == sweep.contains("base_file")) {
    throw ConfigError("sweep: give exactly one of base and base_file");
  }
  if (!sweep.contains("grid") && !sweep.contains("points") && !sweep.contains("repeat") &&
      !sweep.contains("lr_search")) {
    throw ConfigError(
        "sweep: give a grid {\"dotted.key\": [values, ...]}, points [{\"dotted.key\": value}, ...], "
        "repeat or lr_search");
  }
  if (sweep.contains("grid") && (!sweep.at("grid").is_object() || sweep.at("grid").empty())) {
    throw ConfigError("sweep.grid: expected a non-empty object {\"dotted.key\": [values, ...]}");
  }
  for (const char* key : {"name", "description"}) {
    if (sweep.contains(key) && !sweep.at(key).is_string())
      throw ConfigError(std::string("sweep.") + key + ": expected a string, got " + described(sweep.at(key)));
  }
  if (sweep.contains("base") && !sweep.at("base").is_object())
    throw ConfigError("sweep.base: expected an object (a config), got " + described(sweep.at("base")));
}

// A non-empty list of distinct, finite, positive learning rates; errors name the entry.
void check_lr_search(const json& list, const std::string& where) {
  if (!list.is_array() || list.empty()) {
    throw ConfigError(where + ": expected a non-empty array of learning rates, e.g. [1e-3, 3e-3]");
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string entry = where + "[" + std::to_string(i) + "]";
    if (!list[i].is_number()) throw ConfigError(entry + ": expected a number, got " + list[i].dump());
    const double lr = list[i].get<double>();
    if (!std::isfinite(lr) || lr <= 0) throw ConfigError(entry + ": " + list[i].dump() + " must be finite and > 0");
    for (std::size_t j = 0; j < i; ++j) {
      if (list[j].get<double>() == lr) {
        throw ConfigError(entry + ": " + list[i].dump() + " repeats " + where + "[" + std::to_string(j) + "]");
      }
    }
  }
}

int checked_repeat(const json& sweep) {
  if (!sweep.contains("repeat")) return 0;
  const json& r = sweep.at("repeat");
  if (!r.is_number_integer()) throw ConfigError("sweep.repeat: expected an integer number of seeds, got " + r.dump());
  if (r.get<std::int64_t>() < 1 || r.get<std::int64_t>() > kMaxRepeat) {
    throw ConfigError("sweep.repeat: " + r.dump() + " is out of range [1, " + std::to_string(kMaxRepeat) + "]");
  }
  return r.get<int>();
}

std::vector<PendingPoint> expand_points(const json& sweep, const json& base) {
  const json* shared_lrs = sweep.contains("lr_search") ? &sweep.at("lr_search") : nullptr;
  if (!sweep.contains("points")) return {{{base, {}}, shared_lrs}};
  const json& list = sweep.at("points");
  if (!list.is_array() || list.empty()) throw ConfigError("sweep.points: expected a non-empty array of objects");
  std::vector<PendingPoint> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = "sweep.points[" + std::to_string(i) + "]";
    if (!list[i].is_object()) throw ConfigError(where + ": expected an object");
    PendingPoint q{{base, {}}, shared_lrs};
    for (const auto& [key, value] : list[i].items()) {
      if (key == "lr_search") {  // this point's own search replaces the sweep's
        check_lr_search(value, where + ".lr_search");
        q.lr_search = &value;
        continue;
      }
      set_dotted(q.point.config, key, value, where + "." + key);
      q.point.assignment.emplace_back(key, value);
    }
    for (const auto& [key, value] : q.point.assignment) {
      if (key == "optimizer.lr" && q.lr_search != nullptr) {
        throw ConfigError(where + ": sets optimizer.lr, and lr_search applies to it: give the rates in one place");
      }
    }
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<PendingPoint> expand_grid(const json& sweep, std::vector<PendingPoint> points) {
  if (!sweep.contains("grid")) return points;
  for (const auto& [key, values] : sweep.at("grid").items()) {
    if (!values.is_array() || values.empty())
      throw ConfigError("sweep.grid." + key + ": expected a non-empty array of values");
    if (points.size() * values.size() > kMaxSweepPoints)
      throw ConfigError("sweep.grid." + key + ": the sweep would expand to " + std::to_string(points.size()) + " x " +
                        std::to_string(values.size()) + " points, more than " + std::to_string(kMaxSweepPoints) +
                        "; split it into several sweeps");
    std::vector<PendingPoint> next;
    for (const auto& p : points) {
      for (const auto& v : values) {
        PendingPoint q = p;
        set_dotted(q.point.config, key, v, "sweep.grid." + key);
        q.point.assignment.emplace_back(key, v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  return points;
}

// The seed a repeat counts from: the point's own (set by the base, its point or the grid), else
// the default.
std::uint64_t first_seed(const json& config) {
  if (!config.is_object() || !config.contains("seed")) return ExperimentConfig{}.seed;
  const json& s = config.at("seed");
  if (!s.is_number_integer() || s.get<std::int64_t>() < 0) {
    throw ConfigError("seed: expected a non-negative integer (sweep.repeat counts seeds from it), got " + s.dump());
  }
  return s.get<std::uint64_t>();
}

}  // namespace

std::vector<SweepPoint> expand_sweep(const json& sweep, const std::filesystem::path& base_dir) {
  check_top_keys(sweep);
  if (sweep.contains("lr_search")) check_lr_search(sweep.at("lr_search"), "sweep.lr_search");
  const int repeat = checked_repeat(sweep);
  const json no_grid = json::object();
  const json& grid = sweep.contains("grid") ? sweep.at("grid") : no_grid;
  if (repeat > 0 && grid.contains("seed")) {
    throw ConfigError("sweep.repeat: cannot be combined with grid.seed: give the seeds in one place");
  }
  if (sweep.contains("base_file") && !sweep.at("base_file").is_string())
    throw ConfigError("sweep.base_file: expected a file name, got " + type_name(sweep.at("base_file")));
  json base = sweep.contains("base") ? sweep.at("base")
                                     : read_json_file(resolve_path(sweep.at("base_file").get<std::string>(), base_dir));
  auto pending = expand_grid(sweep, expand_points(sweep, base));
  std::vector<SweepPoint> points;
  for (auto& p : pending) {
    if (p.lr_search != nullptr && grid.contains("optimizer.lr")) {
      throw ConfigError("sweep.grid.optimizer.lr: cannot be combined with lr_search: give the rates in one place");
    }
    std::vector<SweepPoint> at_lr;
    if (p.lr_search == nullptr) {
      at_lr.push_back(std::move(p.point));
    } else {
      for (const auto& lr : *p.lr_search) {
        SweepPoint q = p.point;
        apply_override(q.config, "optimizer.lr=" + lr.dump());
        q.assignment.emplace_back("optimizer.lr", lr);
        at_lr.push_back(std::move(q));
      }
    }
    for (auto& q : at_lr) {
      if (repeat == 0) {
        points.push_back(std::move(q));
        continue;
      }
      const std::uint64_t seed = first_seed(q.config);
      if (seed > std::numeric_limits<std::uint64_t>::max() - static_cast<std::uint64_t>(repeat - 1)) {
        throw ConfigError("sweep.repeat: seed " + std::to_string(seed) + " + " + std::to_string(repeat - 1) +
                          " overflows");
      }
      for (int k = 0; k < repeat; ++k) {
        SweepPoint r = q;
        r.config["seed"] = seed + static_cast<std::uint64_t>(k);
        std::erase_if(r.assignment, [](const auto& a) { return a.first == "seed"; });  // the point's first seed
        r.assignment.emplace_back("seed", r.config["seed"]);
        points.push_back(std::move(r));
      }
    }
  }
  return points;
}

}  // namespace scape::config
