// Checkpoint files and the StateMap byte encoding. The file format (magic SCAPECK1) is fixed:
// checkpoints of interrupted runs must keep loading after an upgrade.
//
//   "SCAPECK1"  run id (u64 length + bytes)  step (u64)  rank count (u64)
//   one StateMap encoding per rank (write_state_map)  parameters (u64 length + float32 bytes)
#include "train/checkpoint.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

namespace scape::train {
namespace {

constexpr char kMagic[] = "SCAPECK1";
constexpr std::size_t kMagicSize = 8;
constexpr std::size_t kMaxNameBytes = 256;
constexpr std::size_t kMaxRunIdBytes = 64;

void put_u64(std::ostream& out, std::uint64_t x) { out.write(reinterpret_cast<const char*>(&x), sizeof x); }

void put_bytes(std::ostream& out, const void* p, std::size_t n) {
  put_u64(out, n);
  out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
}

std::uint64_t get_u64(std::istream& in) {
  std::uint64_t x = 0;
  in.read(reinterpret_cast<char*>(&x), sizeof x);
  if (!in) throw StateFormatError("truncated");
  return x;
}

std::vector<std::byte> get_bytes(std::istream& in, std::size_t limit) {
  const std::uint64_t size = get_u64(in);
  if (size > limit) throw StateFormatError("entry larger than expected");
  std::vector<std::byte> bytes(size);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!in) throw StateFormatError("truncated");
  return bytes;
}

std::string as_string(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Throws StateFormatError for a corrupt file, ConfigError for one of another configuration.
Checkpoint read_checkpoint(std::istream& in, const std::filesystem::path& path, const std::string& run_id, int workers,
                           std::size_t n) {
  char magic[kMagicSize];
  in.read(magic, kMagicSize);
  if (!in || std::string(magic, kMagicSize) != kMagic) throw StateFormatError("bad magic");
  const std::string stored_id = as_string(get_bytes(in, kMaxRunIdBytes));
  if (stored_id != run_id) {
    throw experiments::ConfigError(path.string() + ": the checkpoint belongs to another configuration (run id " +
                                   stored_id + ", this config is " + run_id + ")");
  }
  Checkpoint c;
  c.step = static_cast<int>(get_u64(in));
  if (get_u64(in) != static_cast<std::uint64_t>(workers)) throw StateFormatError("worker count differs");
  const std::size_t max_entry_bytes = (n + 1024) * 16;
  c.states.resize(static_cast<std::size_t>(workers));
  for (StateMap& state : c.states) state = read_state_map(in, max_entry_bytes);
  const std::vector<std::byte> p = get_bytes(in, n * sizeof(float));
  if (p.size() != n * sizeof(float)) throw StateFormatError("parameter count differs");
  c.params.resize(n);
  if (n > 0) std::memcpy(c.params.data(), p.data(), p.size());
  return c;
}

}  // namespace

void write_state_map(std::ostream& out, const StateMap& state) {
  put_u64(out, state.size());
  for (const auto& [name, bytes] : state) {
    put_bytes(out, name.data(), name.size());
    put_bytes(out, bytes.data(), bytes.size());
  }
}

StateMap read_state_map(std::istream& in, std::size_t max_entry_bytes) {
  StateMap state;
  const std::uint64_t entries = get_u64(in);
  for (std::uint64_t e = 0; e < entries; ++e) {
    const std::string name = as_string(get_bytes(in, kMaxNameBytes));
    state[name] = get_bytes(in, max_entry_bytes);
  }
  return state;
}

std::string encode_state_map(const StateMap& state) {
  std::ostringstream out(std::ios::binary);
  write_state_map(out, state);
  return std::move(out).str();
}

StateMap decode_state_map(std::span<const char> bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()), std::ios::binary);
  StateMap state = read_state_map(in, bytes.size());
  if (in.peek() != std::char_traits<char>::eof()) throw StateFormatError("bytes after the last entry");
  return state;
}

std::filesystem::path checkpoint_path(const std::filesystem::path& run_file) { return run_file.string() + ".ckpt"; }

void write_checkpoint(const std::filesystem::path& path, const std::string& run_id, int step,
                      const std::vector<StateMap>& states, std::span<const float> params) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot write the checkpoint");
    out.write(kMagic, kMagicSize);
    put_bytes(out, run_id.data(), run_id.size());
    put_u64(out, static_cast<std::uint64_t>(step));
    put_u64(out, states.size());
    for (const StateMap& state : states) write_state_map(out, state);
    put_bytes(out, params.data(), params.size_bytes());
    if (!out) throw std::runtime_error(tmp + ": writing the checkpoint failed");
  }
  std::filesystem::rename(tmp, path);
}

Checkpoint load_checkpoint(const experiments::ExperimentConfig& config, const std::filesystem::path& run_file,
                           std::size_t n) {
  const std::filesystem::path path = checkpoint_path(run_file);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw experiments::ConfigError(path.string() + ": no checkpoint to resume from");
  try {
    return read_checkpoint(in, path, experiments::run_id(config.to_json()), config.workers, n);
  } catch (const StateFormatError& e) {
    throw experiments::ConfigError(path.string() + ": corrupt checkpoint (" + e.what() + ")");
  }
}

}  // namespace scape::train
