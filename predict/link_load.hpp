// A shaped link's two regimes (docs/PREDICTING.md, "A link's load"): a collective that starts on
// a link left idle (by the forward and backward passes) runs at the link's full rate, while one
// that follows another collective on the same link finds its transport already at a lower,
// sustained rate, and small messages pass through the shaper's bucket faster than the rate. One
// alpha-beta line cannot hold these, so the link keeps bench-comm's measured time of each
// collective kind in each regime as a curve over the bytes a worker sends, interpolated.
#pragma once

#include <array>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ledger.hpp"

namespace scape::predict {

// What the link did just before a collective: nothing (idle) or another collective (busy).
enum class LinkLoad { idle, busy };
const char* to_string(LinkLoad load);

// Measured seconds of one collective kind against the bytes a worker sent, ascending in bytes.
struct MeasuredCurve {
  std::vector<double> bytes_sent;
  std::vector<double> time_s;
};

// Linear between the measured points; below the smallest the smallest's time (latency-bound);
// above the largest the last segment's slope carried on. Throws std::invalid_argument for an
// empty curve.
double curve_time(const MeasuredCurve& curve, double bytes_sent);

struct LoadCurves {
  int workers = 2;  // the ranks the bench ran on: the curves cost rings of that many
  // A link `rate_scale` times as fast as the bench's: b bytes take what b / rate_scale took there.
  double rate_scale = 1;
  std::array<std::optional<MeasuredCurve>, kCollectiveKindCount> idle{}, busy{};  // by CollectiveKind
  const std::optional<MeasuredCurve>& at(LinkLoad load, CollectiveKind kind) const {
    return (load == LinkLoad::idle ? idle : busy)[static_cast<std::size_t>(kind)];
  }
};

// Seconds of a ring of `kind` over `payload_bytes` among `workers` in regime `load` on a port of
// which the caller has `port_share` (the others' bytes cross it at once, so it carries the
// caller's bytes / share); none when the curves have no such kind or ran on other ranks.
std::optional<double> loaded_time(const LoadCurves& curves, CollectiveKind kind, int workers, double payload_bytes,
                                  LinkLoad load, double port_share);

// network.inter_curves of a prediction config and a hardware description, and its parser
// (throws std::invalid_argument naming the key under `path`).
nlohmann::json inter_curves_json(const LoadCurves& curves);
LoadCurves parse_inter_curves(const nlohmann::json& j, const std::string& path);

}  // namespace scape::predict
