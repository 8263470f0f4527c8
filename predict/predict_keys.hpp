// The keys of prediction configs, one Field list per section (predict_keys.cpp): kind, doc
// line, range, and the default where it does not follow from other keys (a preset, the
// family, the worker counts). The parser (predict_config.cpp) and `scape schema --predict` read
// them; docs/PREDICTING.md lists them.
#pragma once

#include <vector>

#include "config/json_section.hpp"

namespace scape::predict {

using config::Field;

const std::vector<Field>& top_fields();
const std::vector<Field>& model_fields();
const std::vector<Field>& batch_fields();
const std::vector<Field>& gpu_fields();
const std::vector<Field>& network_fields();
// network.inter and network.intra: the link keys of run configs, with their own default preset.
const std::vector<Field>& inter_fields();
const std::vector<Field>& intra_fields();
// network.collectives: one section per collective kind, each with the link keys but the preset.
const std::vector<Field>& collectives_fields();
const std::vector<Field>& measured_link_fields();
const std::vector<Field>& overlap_fields();

}  // namespace scape::predict
