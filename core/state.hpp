// Optimizer state as named byte blobs, for checkpoints: a resumed run must continue bit for
// bit, so every buffer that influences later steps is saved exactly.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace scape {

using StateMap = std::map<std::string, std::vector<std::byte>>;

template <typename T>
void put_state(StateMap& state, const std::string& name, const std::vector<T>& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::byte> bytes(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  state[name] = std::move(bytes);
}

template <typename T>
void put_state_value(StateMap& state, const std::string& name, const T& x) {
  put_state(state, name, std::vector<T>{x});
}

// Throws std::runtime_error naming the entry when it is missing or has a wrong size.
template <typename T>
void get_state(const StateMap& state, const std::string& name, std::vector<T>& v) {
  const auto it = state.find(name);
  if (it == state.end()) throw std::runtime_error("checkpoint: missing optimizer state '" + name + "'");
  if (it->second.size() % sizeof(T) != 0) throw std::runtime_error("checkpoint: optimizer state '" + name + "' is corrupt");
  v.resize(it->second.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), it->second.data(), it->second.size());
}

template <typename T>
T get_state_value(const StateMap& state, const std::string& name) {
  std::vector<T> v;
  get_state(state, name, v);
  if (v.size() != 1) throw std::runtime_error("checkpoint: optimizer state '" + name + "' is not a scalar");
  return v[0];
}

}  // namespace scape
