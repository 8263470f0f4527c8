// An advisory lock on one run file: one writer per file (`scape run`, `run --resume`, `repair`, and
// `scape sweep`, whose two instances writing into one folder never run the same point twice). The
// lock is flock(2) on a sibling file `<run file>.lock`, which also holds the holder's "pid host"
// so that a refused writer can name it; the kernel drops the lock when its holder exits, killed or
// not, so a crashed writer never leaves its file locked (a lock file left behind names a holder
// that is gone, and the next writer takes it over, saying so).
#pragma once

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace scape::run_file {

// The process a lock file names ("pid host", written by the holder).
struct LockHolder {
  long pid = 0;
  std::string host;
  std::string describe() const;  // "pid 123 on host h"
  bool alive() const;            // a live pid on this host, or any pid on another host (not checkable here)
};

// Another process holds the lock of a run file; the message names the file and the holder.
class RunFileBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunFileLock {
 public:
  // The lock of `run_file`, or nothing when another process (or another RunFileLock here)
  // holds it. Throws std::system_error naming the lock file when it cannot be created. On a
  // filesystem without flock (Lustre mounted without `flock`, some FUSE mounts) it returns a
  // lock that holds nothing (holds() false), so that a sweep there still runs.
  static std::optional<RunFileLock> try_acquire(const std::filesystem::path& run_file);
  // Waits until the lock is free, then takes it.
  static RunFileLock acquire(const std::filesystem::path& run_file);

  RunFileLock(RunFileLock&& other) noexcept;
  RunFileLock& operator=(RunFileLock&& other) noexcept;
  RunFileLock(const RunFileLock&) = delete;
  RunFileLock& operator=(const RunFileLock&) = delete;
  ~RunFileLock();  // removes the lock file (when its name is still this lock's), then releases the lock

  // The lock of `run_file` for one writer: throws RunFileBusy, naming the file and the holder
  // (its pid and host as its lock file says), when another process holds it.
  static RunFileLock for_writing(const std::filesystem::path& run_file);
  // The holder the lock file of `run_file` names, if it names one.
  static std::optional<LockHolder> holder(const std::filesystem::path& run_file);

  const std::filesystem::path& lock_file() const { return lock_file_; }
  bool holds() const { return fd_ >= 0; }
  // The holder a lock file left behind named when this lock was taken: a writer that ended
  // without releasing it (killed), whose lock this one took over.
  const std::optional<LockHolder>& taken_over() const { return taken_over_; }
  // "RUN.h5.lock: took over the lock of pid P on host H, which ended without releasing it", or
  // empty when no holder was taken over.
  std::string taken_over_note() const;

 private:
  RunFileLock(std::filesystem::path lock_file, int fd) : lock_file_(std::move(lock_file)), fd_(fd) {}
  static std::optional<RunFileLock> take(const std::filesystem::path& run_file, bool wait);
  void release() noexcept;

  std::filesystem::path lock_file_;
  int fd_ = -1;
  std::optional<LockHolder> taken_over_;
};

}  // namespace scape::run_file
