// The common switches' names, the common keys' ranges, and the checks of the common fields.
#include "core/optimizer_config.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "util/name_table.hpp"

namespace scape {
namespace {

constexpr EnumName<InnerRule> kInner[] = {{"adams", InnerRule::adams}, {"adamw", InnerRule::adamw}};
constexpr EnumName<MaskEncoding> kEncoding[] = {{"bitmap", MaskEncoding::bitmap},
                                                {"elias_fano", MaskEncoding::elias_fano},
                                                {"delta", MaskEncoding::delta},
                                                {"auto", MaskEncoding::auto_select}};
// "automatic" is what an absent adams_form resolves from; a config names one of the other two.
constexpr EnumName<Hierarchy> kHierarchy[] = {{"flat", Hierarchy::flat}, {"node", Hierarchy::node}};
constexpr EnumName<RailSplit> kRailSplit[] = {{"tensors", RailSplit::tensors}, {"rows", RailSplit::rows}};
constexpr EnumName<AdamsForm> kAdamsForm[] = {{"artifact", AdamsForm::artifact},
                                              {"momentum_corrected", AdamsForm::momentum_corrected}};

constexpr double kInf = std::numeric_limits<double>::infinity();

// min_lr (at most lr) and the betas (a pair) keep their own checks in validate_hyperparameters().
constexpr OptimizerKeyRange kRanges[] = {
    {"lr", 0, kInf, true, true, "must be finite and > 0"},
    {"warmup_steps", 0, kInf, false, true, "must be >= 0"},
    {"eps", 0, kInf, true, true, "must be finite and > 0"},
    {"weight_decay", 0, kInf, false, true, "must be >= 0"},
    {"sparsity", 0, 1, false, true, "must be in [0, 1): the density 1 - sparsity must lie in (0, 1]"},
    {"density_warmup", 0, kInf, false, true, "must be >= 0"},
    {"density_start", 0, 1, true, false, "must be in (0, 1]"},
    {"density_cooldown", 0, kInf, false, true, "must be >= 0 (0 = off)"},
    {"density_cooldown_start", 0, kInf, false, true, "must be >= 0"},
    {"clip_grad", 0, kInf, false, true, "must be finite and >= 0 (0 = off)"},
    {"residual_decay", 0, 1, false, false, "must be in [0, 1]"},
    {"residual_clip", 0, kInf, false, true, "must be finite and >= 0 (0 = off)"},
    {"offload_chunk", 1024, 1 << 30, false, false, "must be in [1024, 2^30] elements"},
};

bool in_range(const OptimizerKeyRange& r, double x) {
  const bool above = r.exclusive_minimum ? x > r.minimum : x >= r.minimum;
  const bool below = r.exclusive_maximum ? x < r.maximum : x <= r.maximum;
  return above && below;
}

void check_range(const char* key, double value) { check_key_range(kRanges, key, value); }

}  // namespace

const OptimizerKeyRange* find_key_range(std::span<const OptimizerKeyRange> ranges, std::string_view key) {
  for (const auto& r : ranges) {
    if (key == r.key) return &r;
  }
  return nullptr;
}

std::span<const OptimizerKeyRange> common_key_ranges() { return kRanges; }

void reject_out_of_range(const std::string& parameter, double value, const std::string& rule) {
  std::ostringstream os;
  os << parameter << ": " << value << " is out of range (" << rule << ")";
  throw std::invalid_argument(os.str());
}

void reject_switch(const std::string& key, const std::string& why) {
  throw std::invalid_argument("optimizer." + key + ": " + why);
}

void check_key_range(std::span<const OptimizerKeyRange> ranges, const char* key, double value) {
  const OptimizerKeyRange* r = find_key_range(ranges, key);
  if (r == nullptr) throw std::invalid_argument("check_key_range: '" + std::string(key) + "' has no declared range");
  if (!in_range(*r, value)) reject_out_of_range(std::string("optimizer.") + key, value, r->rule);
}

InnerRule parse_inner_rule(std::string_view v) { return find_by_name(kInner, v, "optimizer.inner").value; }
MaskEncoding parse_mask_encoding(std::string_view v) {
  return find_by_name(kEncoding, v, "optimizer.mask_encoding").value;
}
AdamsForm parse_adams_form(std::string_view v) { return find_by_name(kAdamsForm, v, "optimizer.adams_form").value; }
const char* to_string(AdamsForm v) { return v == AdamsForm::automatic ? "automatic" : name_of(kAdamsForm, v); }
const char* to_string(InnerRule v) { return name_of(kInner, v); }
Hierarchy parse_hierarchy(std::string_view v) { return find_by_name(kHierarchy, v, "optimizer.hierarchy").value; }
RailSplit parse_rail_split(std::string_view v) { return find_by_name(kRailSplit, v, "optimizer.rail_split").value; }
const char* to_string(Hierarchy v) { return name_of(kHierarchy, v); }
const char* to_string(RailSplit v) { return name_of(kRailSplit, v); }
const char* to_string(MaskEncoding v) { return name_of(kEncoding, v); }

std::vector<std::string> common_switch_names(std::string_view key) {
  if (key == "inner") return names_of(kInner);
  if (key == "mask_encoding") return names_of(kEncoding);
  if (key == "adams_form") return names_of(kAdamsForm);
  if (key == "hierarchy") return names_of(kHierarchy);
  if (key == "rail_split") return names_of(kRailSplit);
  return {};
}

void CommonOptimizerConfig::validate_hyperparameters() const {
  check_range("lr", lr);
  if (min_lr >= 0 && !(min_lr <= lr)) reject_out_of_range("optimizer.min_lr", min_lr, "must be in [0, lr]");
  check_range("warmup_steps", warmup_steps);
  if (!(beta1 >= 0 && beta1 < 1)) reject_out_of_range("optimizer.betas[0]", beta1, "must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) reject_out_of_range("optimizer.betas[1]", beta2, "must be in [0, 1)");
  check_range("eps", eps);
  check_range("weight_decay", weight_decay);
}

void CommonOptimizerConfig::validate_sparse_fields() const {
  const double rho = density();
  check_range("sparsity", sparsity);
  if (!(rho > 0 && rho <= 1))
    reject_out_of_range("optimizer.sparsity", sparsity, "density 1 - sparsity must lie in (0, 1]");
  check_range("density_warmup", density_warmup);
  check_range("residual_decay", residual_decay);
  check_range("residual_clip", residual_clip);
  check_range("density_start", density_start);
  check_range("density_cooldown", density_cooldown);
  check_range("density_cooldown_start", density_cooldown_start);
  if (density_cooldown > 0 && density_warmup > 0) {
    reject_switch("density_cooldown",
                  "the cool-down replaces the density warm-up (as in the artifact); set "
                  "optimizer.density_warmup = 0 or density_cooldown = 0");
  }
}

}  // namespace scape
