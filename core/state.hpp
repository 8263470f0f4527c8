// Optimizer state as named byte blobs, for checkpoints: a resumed run must continue bit for
// bit, so every buffer that influences later steps is saved exactly.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace scape {

using StateMap = std::map<std::string, std::vector<std::byte>>;

template <typename T>
void put_state(StateMap& state, const std::string& name, std::span<T> v) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::byte> bytes(v.size_bytes());
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  state[name] = std::move(bytes);
}

template <typename T>
void put_state(StateMap& state, const std::string& name, const std::vector<T>& v) {
  put_state(state, name, std::span<const T>(v));
}

template <typename T>
void put_state_value(StateMap& state, const std::string& name, const T& x) {
  put_state(state, name, std::vector<T>{x});
}

// The bytes of entry `name`, holding a whole number of T; throws std::runtime_error naming the
// entry when it is missing or its size is not a multiple of sizeof(T).
template <typename T>
const std::vector<std::byte>& state_entry(const StateMap& state, const std::string& name) {
  const auto it = state.find(name);
  if (it == state.end()) throw std::runtime_error("checkpoint: missing optimizer state '" + name + "'");
  if (it->second.size() % sizeof(T) != 0)
    throw std::runtime_error("checkpoint: optimizer state '" + name + "' is corrupt");
  return it->second;
}

// Into a resizable array (std::vector or kernels::Buffer, anything with resize() and data()),
// sized to the entry. Throws std::runtime_error naming the entry when it is missing or has a
// wrong size.
template <typename Array>
void get_state(const StateMap& state, const std::string& name, Array& v) {
  using T = std::remove_pointer_t<decltype(v.data())>;
  const auto& bytes = state_entry<T>(state, name);
  v.resize(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
}

// Into a buffer of fixed size: throws std::runtime_error when the entry's size differs.
template <typename T>
void get_state_exact(const StateMap& state, const std::string& name, std::span<T> out) {
  const auto& bytes = state_entry<T>(state, name);
  if (bytes.size() != out.size_bytes()) {
    throw std::runtime_error("checkpoint: optimizer state '" + name + "' holds " + std::to_string(bytes.size()) +
                             " bytes, this optimizer needs " + std::to_string(out.size_bytes()));
  }
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
}

template <typename T>
T get_state_value(const StateMap& state, const std::string& name) {
  std::vector<T> v;
  get_state(state, name, v);
  if (v.size() != 1) throw std::runtime_error("checkpoint: optimizer state '" + name + "' is not a scalar");
  return v[0];
}

}  // namespace scape
