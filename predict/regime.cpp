// Break-even bandwidth and the regime sweep (docs/PREDICTING.md, "Regime").
#include "predict/regime.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "predict/prediction.hpp"

namespace scape::predict {
namespace {

struct AtW {
  double speedup = 0;
  double baseline_efficiency = 0;
};

AtW evaluate(const PredictConfig& c, int w) {
  const StepInputs opt = step_inputs(c, c.optimizer);
  const StepInputs base = step_inputs(c, c.baseline);
  const StepPrediction o = predict_step(opt, w, c.batch.tokens_per_gpu(w));
  const StepPrediction b = predict_step(base, w, c.batch.tokens_per_gpu(w));
  const StepPrediction b1 = predict_step(base, 1, c.batch.global_tokens(w));
  return AtW{b.step_s / o.step_s, scaling_efficiency(b1, b)};
}

int largest(const PredictConfig& c) { return *std::max_element(c.workers.begin(), c.workers.end()); }

bool crosses_inter_node(const PredictConfig& c, int w) { return place(c.topology(), w).nodes > 1; }

// The bandwidth in [kMinGBps, kMaxGBps] where f changes sign (f(lo) and f(hi) differ in
// sign), by bisection on log-bandwidth; NaN when they do not.
double crossing(const std::function<double(double)>& f) {
  double lo = std::log(kMinGBps), hi = std::log(kMaxGBps);
  const double f_lo = f(std::exp(lo));
  if ((f_lo > 0) == (f(std::exp(hi)) > 0)) return NAN;
  while (hi - lo > 1e-4) {
    const double mid = 0.5 * (lo + hi);
    if ((f(std::exp(mid)) > 0) == (f_lo > 0)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return std::exp(0.5 * (lo + hi));
}

std::string gbps(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GB/s", x);
  return buf;
}

}  // namespace

PredictConfig with_link_bandwidth(PredictConfig c, int workers, double GBps) {
  LinkSpec& link = crosses_inter_node(c, workers) ? c.inter : c.intra;
  link.preset.clear();
  link.bandwidth_GBps = GBps;
  for (auto& k : c.collectives) k.reset();
  return c;
}

BreakEven break_even(const PredictConfig& c) {
  BreakEven b;
  b.workers = largest(c);
  b.inter_node = crosses_inter_node(c, b.workers);
  const auto at = [&](double GBps) { return evaluate(with_link_bandwidth(c, b.workers, GBps), b.workers); };
  b.speedup_one_GBps = crossing([&](double x) { return at(x).speedup - 1.0; });
  b.speedup_above_one_everywhere = at(kMaxGBps).speedup > 1.0;
  b.baseline_half_efficiency_GBps = crossing([&](double x) { return at(x).baseline_efficiency - 0.5; });
  b.baseline_half_everywhere = at(kMinGBps).baseline_efficiency >= 0.5;
  return b;
}

void print_break_even(std::ostream& out, const PredictConfig& c, const BreakEven& b) {
  const std::string link = b.inter_node ? "inter-node port" : "NVLink (one node)";
  const std::string opt = to_string(c.optimizer.type), base = to_string(c.baseline.type);
  out << "\nbreak-even at W = " << b.workers << ", bandwidth of the " << link << " per direction: ";
  if (std::isnan(b.speedup_one_GBps)) {
    out << opt << (b.speedup_above_one_everywhere ? " beats " : " never beats ") << base << " between "
        << gbps(kMinGBps) << " and " << gbps(kMaxGBps);
  } else {
    out << opt << " beats " << base << " below " << gbps(b.speedup_one_GBps);
  }
  out << "; " << base << "'s efficiency ";
  if (std::isnan(b.baseline_half_efficiency_GBps)) {
    out << (b.baseline_half_everywhere ? "stays at or above" : "stays under") << " 50% in that range\n";
  } else {
    out << "drops under 50% below " << gbps(b.baseline_half_efficiency_GBps) << "\n";
  }
}

void print_regime_sweep(std::ostream& out, const PredictConfig& c, const std::vector<double>& bandwidths_GBps) {
  const int w = largest(c);
  out << "\nregime sweep at W = " << w << " (strong scaling, " << c.batch.seq_len
      << "-token sequences): speedup of " << to_string(c.optimizer.type) << " over " << to_string(c.baseline.type)
      << " (and " << to_string(c.baseline.type) << "'s efficiency) at each bandwidth of the "
      << (crosses_inter_node(c, w) ? "inter-node port" : "NVLink") << "\n\n| overlap | sequences/GPU | global tokens |";
  for (const double b : bandwidths_GBps) out << " " << gbps(b) << " |";
  out << "\n|---|---|---|";
  for (std::size_t i = 0; i < bandwidths_GBps.size(); ++i) out << "---|";
  out << "\n";
  for (const bool overlap : {true, false}) {
    for (const int per_gpu : {1, 2, 4, 8, 16}) {
      PredictConfig s = c;
      s.batch.scaling = Scaling::strong;
      s.batch.global_sequences = static_cast<std::int64_t>(per_gpu) * w;
      s.workers = {w};
      s.overlap.grad_reduce = s.overlap.param_gather = overlap;
      out << "| " << (overlap ? "on" : "off") << " | " << per_gpu << " | "
          << static_cast<long long>(s.batch.global_tokens(w)) << " |";
      for (const double b : bandwidths_GBps) {
        const AtW r = evaluate(with_link_bandwidth(s, w, b), w);
        char cell[48];
        std::snprintf(cell, sizeof cell, " %.2f (%.2f) |", r.speedup, r.baseline_efficiency);
        out << cell;
      }
      out << "\n";
    }
  }
}

}  // namespace scape::predict
