// Checkpoint files and the StateMap byte encoding. Both file formats are fixed: checkpoints of
// interrupted runs must keep loading after an upgrade. Written since issue 18 (SCAPECK2):
//
//   "SCAPECK2"  resolved config JSON (u64 length + bytes)  step (u64)  rank count (u64)
//   one StateMap encoding per rank (write_state_map)  parameters (u64 length + float32 bytes)
//   checksum (u64): FNV-1a 64 of every byte before it
//
// Read only (written before issue 18, no checksum, tied to its config by run id alone):
//
//   "SCAPECK1"  run id (u64 length + bytes)  step (u64)  rank count (u64)  states  parameters
#include "train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "run_file/hdf5.hpp"
#include "run_file/run_summary.hpp"
#include "util/fnv1a.hpp"

namespace scape::train {
namespace {

constexpr char kMagicV1[] = "SCAPECK1";
constexpr char kMagicV2[] = "SCAPECK2";
constexpr std::size_t kMagicSize = 8;
constexpr std::size_t kChecksumSize = 8;
constexpr std::size_t kMaxNameBytes = 256;
constexpr std::size_t kMaxRunIdBytes = 64;
constexpr std::size_t kMaxConfigBytes = 1 << 20;

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

std::uint64_t checksum_of(std::string_view bytes) { return fnv1a_64(bytes); }

// The states and parameters after the header; the step and rank count come first.
void read_body(std::istream& in, int workers, std::size_t n, Checkpoint& c) {
  const std::uint64_t step = get_u64(in);
  if (step > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) throw StateFormatError("step out of range");
  c.step = static_cast<int>(step);
  if (get_u64(in) != static_cast<std::uint64_t>(workers)) throw StateFormatError("worker count differs");
  const std::size_t max_entry_bytes = (n + 1024) * 16;
  c.states.resize(static_cast<std::size_t>(workers));
  for (StateMap& state : c.states) state = read_state_map(in, max_entry_bytes);
  const std::vector<std::byte> p = get_bytes(in, n * sizeof(float));
  if (p.size() != n * sizeof(float)) throw StateFormatError("parameter count differs");
  c.params.resize(n);
  if (n > 0) std::memcpy(c.params.data(), p.data(), p.size());
}

// Flattens a resolved config into dotted key -> value text, for listing the keys that differ.
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items()) flatten(value, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  out[prefix] = j.dump();
}

// Keys a resumed run may change: they do not alter the optimizer's trajectory up to the
// checkpoint (steps lengthens or shortens the run; log.* only changes what is recorded).
bool may_change_on_resume(const std::string& key) { return key == "steps" || key.rfind("log.", 0) == 0; }

void check_same_config(const std::filesystem::path& path, const std::string& stored_json,
                       const config::ExperimentConfig& config, const std::string& whose = "the checkpoint's") {
  nlohmann::json stored;
  try {
    stored = nlohmann::json::parse(stored_json);
  } catch (const nlohmann::json::exception&) {  // parse_error, or out_of_range (a number beyond double)
    throw StateFormatError("its config is not JSON");
  }
  std::map<std::string, std::string> before, now;
  flatten(stored, "", before);
  flatten(config.to_json(), "", now);
  std::string differing;
  const auto note = [&](const std::string& key, const std::string& was, const std::string& is) {
    if (may_change_on_resume(key) || was == is) return;
    differing += (differing.empty() ? "" : ", ") + key + " (" + was + " -> " + is + ")";
  };
  for (const auto& [key, was] : before) note(key, was, now.count(key) ? now.at(key) : "absent");
  for (const auto& [key, is] : now)
    if (!before.count(key)) note(key, "absent", is);
  if (!differing.empty()) {
    throw config::ConfigError(path.string() +
                              ": --resume with a changed configuration; only steps and log.* "
                              "may change, but these keys differ from " + whose + ": " + differing);
  }
}

// SCAPECK2: the checksum is checked before anything else is read.
Checkpoint read_v2(const std::string& bytes, const std::filesystem::path& path, const config::ExperimentConfig& config,
                   std::size_t n) {
  if (bytes.size() < kMagicSize + kChecksumSize) throw StateFormatError("truncated");
  const std::size_t body = bytes.size() - kChecksumSize;
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + body, kChecksumSize);
  if (stored != checksum_of(std::string_view(bytes).substr(0, body)))
    throw StateFormatError("checksum mismatch: the file is truncated or damaged");
  std::istringstream in(bytes.substr(kMagicSize, body - kMagicSize), std::ios::binary);
  check_same_config(path, as_string(get_bytes(in, kMaxConfigBytes)), config);
  Checkpoint c;
  read_body(in, config.workers, n, c);
  if (in.peek() != std::char_traits<char>::eof()) throw StateFormatError("bytes after the parameters");
  return c;
}

Checkpoint read_v1(const std::string& bytes, const std::filesystem::path& path, const config::ExperimentConfig& config,
                   std::size_t n) {
  std::istringstream in(bytes.substr(kMagicSize), std::ios::binary);
  const std::string stored_id = as_string(get_bytes(in, kMaxRunIdBytes));
  const std::string run_id = config::run_id(config.to_json());
  if (stored_id != run_id) {
    throw config::ConfigError(path.string() + ": the checkpoint belongs to another configuration (run id " + stored_id +
                              ", this config is " + run_id + ")");
  }
  Checkpoint c;
  read_body(in, config.workers, n, c);
  return c;
}

[[noreturn]] void throw_write_error(const std::string& file, int step, const char* what, int error) {
  throw std::runtime_error("checkpoint " + file + " at step " + std::to_string(step) + ": " + what + ": " +
                           std::strerror(error));
}

// The bytes reach the disk (fsync) before the rename makes them the checkpoint.
void write_durably(const std::string& tmp, const std::string& bytes, int step) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error(tmp, step, "cannot create", errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int error = w < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_write_error(tmp, step, "write failed", error);
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw_write_error(tmp, step, "sync failed", error);
  }
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

std::string encode_checkpoint(const std::string& config_json, int step, const std::vector<StateMap>& states,
                              std::span<const float> params) {
  std::ostringstream out(std::ios::binary);
  out.write(kMagicV2, kMagicSize);
  put_bytes(out, config_json.data(), config_json.size());
  put_u64(out, static_cast<std::uint64_t>(step));
  put_u64(out, states.size());
  for (const StateMap& state : states) write_state_map(out, state);
  put_bytes(out, params.data(), params.size_bytes());
  std::string bytes = std::move(out).str();
  const std::uint64_t sum = checksum_of(bytes);
  bytes.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  return bytes;
}

void write_checkpoint(const std::filesystem::path& path, const std::string& config_json, int step,
                      const std::vector<StateMap>& states, std::span<const float> params) {
  const std::string tmp = path.string() + ".tmp";
  write_durably(tmp, encode_checkpoint(config_json, step, states, params), step);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw_write_error(path.string(), step, "cannot rename the temporary file into place", ec.value());
  }
  // The rename itself reaches the disk with the folder's entry.
  const std::string folder = path.has_parent_path() ? path.parent_path().string() : ".";
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

namespace {

// The run file --resume appends to must be the one the checkpoint's run wrote: a run started
// afresh over the same --out replaces the file, and a checkpoint left from before it would
// append its steps after the other run's rows (a gap, or rows of one config under another).
// The checkpoint is written after the rows up to its step are flushed, so the file's
// steps_completed is never below it for the run that wrote both.
void check_run_file_agrees(const std::filesystem::path& run_file, int step, const config::ExperimentConfig& config) {
  run_file::RunFileSummary summary;
  try {
    summary = run_file::read_run_summary(run_file);
  } catch (const run_file::H5Error&) {
    return;  // missing or not a run file: the recorder's own checks name it
  }
  const std::string again = "; rerun without --resume (the checkpoint is kept)";
  if (summary.steps_completed < step) {
    throw config::ConfigError(run_file.string() + ": holds steps up to " + std::to_string(summary.steps_completed) +
                              ", but the checkpoint " + checkpoint_path(run_file).string() + " resumes after step " +
                              std::to_string(step) +
                              ": they are from different runs (a run started over this --out since)" + again);
  }
  try {
    check_same_config(run_file, summary.config_json, config, "the run file's (the run that wrote it is another)");
  } catch (const StateFormatError&) {
    throw config::ConfigError(run_file.string() + ": its config attribute is not JSON" + again);
  }
}

}  // namespace

Checkpoint load_checkpoint(const config::ExperimentConfig& config, const std::filesystem::path& run_file, std::size_t n,
                           bool allow_unchecked) {
  const std::filesystem::path path = checkpoint_path(run_file);
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path))
    throw config::ConfigError(path.string() + ": no checkpoint to resume from");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Checkpoint checkpoint;
  try {
    const std::string magic = bytes.substr(0, kMagicSize);
    if (magic == kMagicV2) {
      checkpoint = read_v2(bytes, path, config, n);
    } else if (magic == kMagicV1) {
      if (!allow_unchecked) {
        throw config::ConfigError(
            path.string() +
            ": a checkpoint of the older SCAPECK1 format, which carries no checksum: a damaged byte "
            "would resume unnoticed. Add --allow-unchecked-checkpoint to resume from it anyway, or rerun without "
            "--resume");
      }
      checkpoint = read_v1(bytes, path, config, n);
    } else {
      throw StateFormatError("bad magic");
    }
  } catch (const StateFormatError& e) {
    throw config::ConfigError(path.string() + ": corrupt checkpoint (" + e.what() +
                              "); delete it and rerun "
                              "without --resume, or restore a good copy");
  }
  // A run resumed to no further step would record itself completed past its config's steps and
  // remove the checkpoint: refused before anything is written.
  if (config.steps <= checkpoint.step) {
    throw config::ConfigError(path.string() + ": --resume with steps " + std::to_string(config.steps) +
                              ", at or below the checkpoint's step " + std::to_string(checkpoint.step) +
                              "; give steps above " + std::to_string(checkpoint.step) + " (the checkpoint is kept)");
  }
  check_run_file_agrees(run_file, checkpoint.step, config);
  return checkpoint;
}

}  // namespace scape::train
