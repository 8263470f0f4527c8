// Checkpoints (RUN.h5.ckpt): every rank's optimizer state and the parameters, and the one
// byte encoding of a StateMap that both checkpoints and the MPI state gather use.
#pragma once

#include <cstddef>
#include <filesystem>
#include <iosfwd>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "core/state.hpp"

namespace scape::train {

// A StateMap as bytes: u64 entry count, then per entry (in name order) the name and the bytes,
// each as u64 length + data; integers little-endian as the host writes them. Checkpoints
// written since the format's introduction (magic SCAPECK1) hold their states this way.
void write_state_map(std::ostream& out, const StateMap& state);
// Throws StateFormatError when the stream ends early or an entry is larger than
// `max_entry_bytes` (names: 256 bytes at most).
StateMap read_state_map(std::istream& in, std::size_t max_entry_bytes);

struct StateFormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The same encoding in memory (the MPI state gather); decoding throws StateFormatError also
// when bytes are left over.
std::string encode_state_map(const StateMap& state);
StateMap decode_state_map(std::span<const char> bytes);

// What a checkpoint holds: every rank's optimizer state and the (identical) parameters.
struct Checkpoint {
  int step = 0;
  std::vector<StateMap> states;
  std::vector<float> params;
};

std::filesystem::path checkpoint_path(const std::filesystem::path& run_file);

// The bytes of a checkpoint (format SCAPECK2, train/checkpoint.cpp): `config_json` is the
// resolved config (ExperimentConfig::to_json().dump()), which --resume compares key by key.
std::string encode_checkpoint(const std::string& config_json, int step, const std::vector<StateMap>& states,
                              std::span<const float> params);
// Written to PATH.tmp, synced to the disk, then renamed over PATH, so a crash or a full disk
// never leaves a half-written checkpoint: the last good one stays. Throws std::runtime_error
// naming the file, the step and the system's reason when the bytes cannot be written.
void write_checkpoint(const std::filesystem::path& path, const std::string& config_json, int step,
                      const std::vector<StateMap>& states, std::span<const float> params);

// The checkpoint of run file `run_file`. Throws ConfigError naming the file when it is missing,
// corrupt (checksum, truncation, sizes) or from another config: a config that differs in other
// keys than steps and log.* (listed in the message), another worker count, or not n parameters.
// Checkpoints of the older SCAPECK1 format carry no checksum (a damaged byte would resume
// unnoticed): refused unless `allow_unchecked` (scape run --allow-unchecked-checkpoint), and then
// they must match the run id exactly.
Checkpoint load_checkpoint(const config::ExperimentConfig& config, const std::filesystem::path& run_file, std::size_t n,
                           bool allow_unchecked = false);

}  // namespace scape::train
