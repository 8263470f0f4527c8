// The idle and busy curves from bench-comm rows (see link_load_fit.hpp).
#include "predict/link_load_fit.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace scape::predict {

bool has_idle_calls(std::span<const CollectiveSample> samples) {
  return std::any_of(samples.begin(), samples.end(),
                     [](const CollectiveSample& s) { return s.load == LinkLoad::idle; });
}

LoadCurves measured_curves(std::span<const CollectiveSample> samples) {
  int idle = 0;
  for (const auto& s : samples) idle += s.load == LinkLoad::idle;
  if (idle == 0 || idle == static_cast<int>(samples.size())) {
    throw std::invalid_argument("link regimes: the samples need calls of both regimes, idle and busy");
  }
  LoadCurves out;
  out.workers = samples.front().workers;
  // (regime, kind) -> bytes -> (sum of times, count)
  std::map<std::pair<int, int>, std::map<double, std::pair<double, int>>> points;
  for (const auto& s : samples) {
    if (s.workers != out.workers) {
      throw std::invalid_argument("link regimes: the bench-comm rows ran on " + std::to_string(out.workers) + " and " +
                                  std::to_string(s.workers) + " ranks; give one bench's rows");
    }
    auto& p = points[{static_cast<int>(s.load), static_cast<int>(s.kind)}][s.bytes_sent];
    p.first += s.time_s;
    p.second += 1;
  }
  for (const auto& [key, by_bytes] : points) {
    MeasuredCurve c;
    for (const auto& [bytes, sum] : by_bytes) {
      c.bytes_sent.push_back(bytes);
      c.time_s.push_back(sum.first / sum.second);
    }
    auto& table = static_cast<LinkLoad>(key.first) == LinkLoad::idle ? out.idle : out.busy;
    table[static_cast<std::size_t>(key.second)] = std::move(c);
  }
  return out;
}

}  // namespace scape::predict
