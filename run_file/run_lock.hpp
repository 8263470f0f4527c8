// An advisory lock on one run file, so that two `scape sweep`s writing into one folder never run
// the same point twice or overwrite each other's file. The lock is flock(2) on a sibling file
// `<run file>.lock`; the kernel drops it when its holder exits, killed or not, so a crashed sweep
// never leaves a point locked.
#pragma once

#include <filesystem>
#include <optional>

namespace scape::run_file {

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

  const std::filesystem::path& lock_file() const { return lock_file_; }
  bool holds() const { return fd_ >= 0; }

 private:
  RunFileLock(std::filesystem::path lock_file, int fd) : lock_file_(std::move(lock_file)), fd_(fd) {}
  static std::optional<RunFileLock> take(const std::filesystem::path& run_file, bool wait);
  void release() noexcept;

  std::filesystem::path lock_file_;
  int fd_ = -1;
};

}  // namespace scape::run_file
