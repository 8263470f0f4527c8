// How a key table records and sets a member (SCAPE_MEMBER), shared by config_keys.cpp and optimizer_keys.cpp.
#pragma once

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.hpp"

namespace scape::config::key_table_support {

using nlohmann::json;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The value a resolved config records for a member.
template <typename T>
requires std::is_arithmetic_v<T> json recorded(T v) { return v; }
inline json recorded(const std::string& v) { return v; }
inline json recorded(const std::filesystem::path& v) { return v.string(); }
inline json recorded(OptimizerType v) { return to_string(v); }
inline json recorded(InnerRule v) { return to_string(v); }
inline json recorded(Hierarchy v) { return to_string(v); }
inline json recorded(RailSplit v) { return to_string(v); }
inline json recorded(UpdateMode v) { return to_string(v); }
inline json recorded(MaskStatistic v) { return to_string(v); }
inline json recorded(MaskPartition v) { return to_string(v); }
inline json recorded(SecondMoment v) { return to_string(v); }
inline json recorded(MaskEncoding v) { return to_string(v); }
inline json recorded(Formulation v) { return to_string(v); }
inline json recorded(MaskScope v) { return to_string(v); }
inline json recorded(const std::vector<std::string>& v) { return v; }
inline json recorded(WireType v) { return to_string(v); }
inline json recorded(kernels::DeviceKind v) { return kernels::to_string(v); }

// A member set from a value the Section has checked (type, range, choices), so the parsers
// below cannot fail; only an integer too large for the member's type remains.
template <std::integral T>
void assign(T& out, const json& v) {
  const bool fits =
      v.is_number_unsigned() ? std::in_range<T>(v.get<std::uint64_t>()) : std::in_range<T>(v.get<std::int64_t>());
  if (!fits) {
    throw std::out_of_range(v.dump() + " is out of range [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                            std::to_string(std::numeric_limits<T>::max()) + "]");
  }
  out = v.get<T>();
}
inline void assign(bool& out, const json& v) { out = v.get<bool>(); }
inline void assign(double& out, const json& v) { out = v.get<double>(); }
inline void assign(std::string& out, const json& v) { out = v.get<std::string>(); }
inline void assign(std::filesystem::path& out, const json& v) { out = v.get<std::string>(); }
inline void assign(OptimizerType& out, const json& v) { out = parse_optimizer_type(v.get<std::string>()); }
inline void assign(InnerRule& out, const json& v) { out = parse_inner_rule(v.get<std::string>()); }
inline void assign(Hierarchy& out, const json& v) { out = parse_hierarchy(v.get<std::string>()); }
inline void assign(RailSplit& out, const json& v) { out = parse_rail_split(v.get<std::string>()); }
inline void assign(UpdateMode& out, const json& v) { out = parse_update_mode(v.get<std::string>()); }
inline void assign(MaskStatistic& out, const json& v) { out = parse_mask_statistic(v.get<std::string>()); }
inline void assign(MaskPartition& out, const json& v) { out = parse_mask_partition(v.get<std::string>()); }
inline void assign(SecondMoment& out, const json& v) { out = parse_second_moment(v.get<std::string>()); }
inline void assign(MaskEncoding& out, const json& v) { out = parse_mask_encoding(v.get<std::string>()); }
inline void assign(Formulation& out, const json& v) { out = parse_formulation(v.get<std::string>()); }
inline void assign(MaskScope& out, const json& v) { out = parse_mask_scope(v.get<std::string>()); }
inline void assign(std::vector<std::string>& out, const json& v) { out = v.get<std::vector<std::string>>(); }
inline void assign(WireType& out, const json& v) { out = parse_wire_type(v.get<std::string>(), "wire type"); }
inline void assign(kernels::DeviceKind& out, const json& v) {
  out = kernels::parse_device_kind(v.get<std::string>(), "optimizer.device");
}

// The read and write accessors of one member of Config: the two function pointers of a Key.
#define SCAPE_MEMBER(Config, member) \
  [](const Config& c) -> json { return recorded(c.member); }, [](Config& c, const json& v) { assign(c.member, v); }

}  // namespace scape::config::key_table_support
