// The idle and busy curves of a link (predict/link_load.hpp) from bench-comm rows of both
// regimes: calls timed back to back (busy) and calls timed after an idle gap (idle), as `scape
// bench-comm --idle-gap-ms` and netlab/gloo_bench_comm.py write them (docs/PREDICTING.md, "A
// link's load").
#pragma once

#include <span>

#include "predict/calibration.hpp"
#include "predict/link_load.hpp"

namespace scape::predict {

// Each regime's and kind's curve: its samples' times at each distinct size, the mean where a
// size was measured twice (all_gather of floats and of 64-bit words), ascending in bytes. Throws
// std::invalid_argument when the samples hold no idle or no busy call, or ran on different
// numbers of ranks.
LoadCurves measured_curves(std::span<const CollectiveSample> samples);

// Whether any sample was timed after an idle gap (bench-comm --idle-gap-ms).
bool has_idle_calls(std::span<const CollectiveSample> samples);

}  // namespace scape::predict
