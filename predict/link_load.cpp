// A shaped link's idle and busy regimes as measured curves (see link_load.hpp).
#include "predict/link_load.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace scape::predict {
namespace {

constexpr CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                     CollectiveKind::all_gather, CollectiveKind::all_to_all};

std::vector<double> numbers(const nlohmann::json& j, const std::string& path) {
  if (!j.is_array() || j.empty()) throw std::invalid_argument(path + ": expected a non-empty array of numbers");
  std::vector<double> out;
  for (const auto& x : j) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0) {
      throw std::invalid_argument(path + ": expected numbers >= 0, got " + x.dump());
    }
    out.push_back(x.get<double>());
  }
  return out;
}

MeasuredCurve parse_curve(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw std::invalid_argument(path + ": expected an object with bytes_sent and time_s");
  for (const auto& [key, value] : j.items()) {
    if (key != "bytes_sent" && key != "time_s") throw std::invalid_argument(path + ": unknown key " + key);
  }
  if (!j.contains("bytes_sent") || !j.contains("time_s")) {
    throw std::invalid_argument(path + ": a curve gives bytes_sent and time_s");
  }
  MeasuredCurve c{numbers(j.at("bytes_sent"), path + ".bytes_sent"), numbers(j.at("time_s"), path + ".time_s")};
  if (c.bytes_sent.size() != c.time_s.size()) {
    throw std::invalid_argument(path + ": bytes_sent and time_s differ in length");
  }
  for (std::size_t i = 1; i < c.bytes_sent.size(); ++i) {
    if (!(c.bytes_sent[i] > c.bytes_sent[i - 1])) throw std::invalid_argument(path + ".bytes_sent: not ascending");
  }
  return c;
}

}  // namespace

const char* to_string(LinkLoad load) { return load == LinkLoad::idle ? "idle" : "busy"; }

double curve_time(const MeasuredCurve& c, double b) {
  const auto& x = c.bytes_sent;
  const auto& t = c.time_s;
  if (x.empty()) throw std::invalid_argument("curve_time: an empty curve");
  if (b <= x.front() || x.size() == 1) return b <= x.front() ? t.front() : t.back() * b / x.back();
  const std::size_t hi = std::min<std::size_t>(
      x.size() - 1, static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), b) - x.begin()));
  const std::size_t lo = hi - 1;
  return t[lo] + (t[hi] - t[lo]) * (b - x[lo]) / (x[hi] - x[lo]);
}

std::optional<double> loaded_time(const LoadCurves& curves, CollectiveKind kind, int workers, double payload_bytes,
                                  LinkLoad load, double port_share) {
  const auto& curve = curves.at(load, kind);
  if (!curve || workers != curves.workers) return std::nullopt;
  const double sent = ring_bytes_sent_per_worker(kind, workers, payload_bytes);
  return sent > 0 ? curve_time(*curve, sent / (port_share * curves.rate_scale)) : 0.0;
}

nlohmann::json inter_curves_json(const LoadCurves& curves) {
  nlohmann::json j = {{"workers", curves.workers}, {"rate_scale", curves.rate_scale}};
  for (const auto load : {LinkLoad::idle, LinkLoad::busy}) {
    nlohmann::json by_kind = nlohmann::json::object();
    for (const auto kind : kKinds) {
      if (const auto& c = curves.at(load, kind))
        by_kind[to_string(kind)] = {{"bytes_sent", c->bytes_sent}, {"time_s", c->time_s}};
    }
    j[to_string(load)] = by_kind;
  }
  return j;
}

LoadCurves parse_inter_curves(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw std::invalid_argument(path + ": expected an object");
  LoadCurves out;
  for (const auto& [key, value] : j.items()) {
    if (key == "workers") {
      if (!value.is_number_integer() || value.get<int>() < 2)
        throw std::invalid_argument(path + ".workers: an integer >= 2");
      out.workers = value.get<int>();
    } else if (key == "rate_scale") {
      if (!value.is_number() || !(value.get<double>() > 0))
        throw std::invalid_argument(path + ".rate_scale: a number > 0");
      out.rate_scale = value.get<double>();
    } else if (key == "idle" || key == "busy") {
      if (!value.is_object()) throw std::invalid_argument(path + "." + key + ": expected an object of curves by kind");
      auto& table = key == "idle" ? out.idle : out.busy;
      for (const auto& item : value.items()) {
        // A named copy, not a structured binding: clang 14 (the fuzz build) cannot capture one.
        const std::string name = item.key();
        const nlohmann::json& curve = item.value();
        const auto kind =
            std::find_if(std::begin(kKinds), std::end(kKinds), [&](CollectiveKind k) { return name == to_string(k); });
        if (kind == std::end(kKinds))
          throw std::invalid_argument(path + "." + key + ": unknown collective kind " + name);
        table[static_cast<std::size_t>(*kind)] = parse_curve(curve, path + "." + key + "." + name);
      }
    } else {
      throw std::invalid_argument(path + ": unknown key " + key + " (workers, rate_scale, idle, busy)");
    }
  }
  return out;
}

}  // namespace scape::predict
