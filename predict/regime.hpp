// Where a setup's speedup comes from (docs/PREDICTING.md, "Regime"): the break-even link
// bandwidth of a configuration, and the sweep over global batch, link bandwidth and overlap
// that places a reported figure.
#pragma once

#include <ostream>
#include <vector>

#include "predict/predict_config.hpp"

namespace scape::predict {

// Bandwidths of the link the collectives cross at W (the inter-node port, or NVLink when W
// fits one node), per direction, 1e9 bytes/s. NaN when the crossing lies outside the searched
// range [kMinGBps, kMaxGBps]; `*_below` says on which side it lies then.
struct BreakEven {
  int workers = 1;
  bool inter_node = true;
  double speedup_one_GBps = 0;  // above it the optimizer no longer beats its baseline
  bool speedup_above_one_everywhere = false;  // (NaN crossing) true: it wins at every bandwidth
  double baseline_half_efficiency_GBps = 0;   // below it the baseline's efficiency is under 50%
  bool baseline_half_everywhere = false;      // (NaN crossing) true: above 50% at every bandwidth
};

inline constexpr double kMinGBps = 1e-3;
inline constexpr double kMaxGBps = 1e5;

// The config with the bandwidth of the link that W crosses set to `GBps` (per-kind links
// dropped, so every collective runs on it).
PredictConfig with_link_bandwidth(PredictConfig c, int workers, double GBps);
// At the config's largest worker count; bisection on log-bandwidth to 1e-4 relative.
BreakEven break_even(const PredictConfig& c);
void print_break_even(std::ostream& out, const PredictConfig& c, const BreakEven& b);

// The sweep (`scape predict CONFIG --sweep`), strong scaling at the largest worker count W:
// global batches of 1, 2, 4, 8, 16 sequences per GPU times W, the link at the given
// bandwidths, overlap on and off: a table of speedups and the baseline's efficiency.
void print_regime_sweep(std::ostream& out, const PredictConfig& c, const std::vector<double>& bandwidths_GBps);

}  // namespace scape::predict
