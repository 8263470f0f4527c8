#include "run_file/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

namespace scape::run_file {

namespace {

bool names_this_file(const std::filesystem::path& name, int fd) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(name.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev;
}

}  // namespace

// The holder unlinks the lock file before it unlocks, so a waiter can end up holding a lock on
// a file that no longer has the name: it then opens the name again. Only a lock on the inode
// the name points at counts.
std::optional<RunFileLock> RunFileLock::take(const std::filesystem::path& run_file, bool wait) {
  std::filesystem::path lock_file = run_file;
  lock_file += ".lock";
  for (;;) {
    // Read-only: flock needs no write access, so users sharing a folder can lock each other's files.
    const int fd = ::open(lock_file.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw std::system_error(errno, std::generic_category(), lock_file.string() + ": cannot create the lock file");
    int rc;
    do {
      rc = ::flock(fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) return std::nullopt;
      if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return RunFileLock(lock_file, -1);
      throw std::system_error(err, std::generic_category(), lock_file.string() + ": cannot lock");
    }
    if (names_this_file(lock_file, fd)) return RunFileLock(lock_file, fd);
    ::close(fd);  // the previous holder removed it meanwhile: lock the name's new file
  }
}

std::optional<RunFileLock> RunFileLock::try_acquire(const std::filesystem::path& run_file) {
  return take(run_file, false);
}

RunFileLock RunFileLock::acquire(const std::filesystem::path& run_file) { return std::move(*take(run_file, true)); }

RunFileLock::RunFileLock(RunFileLock&& other) noexcept
    : lock_file_(std::move(other.lock_file_)), fd_(std::exchange(other.fd_, -1)) {}

RunFileLock& RunFileLock::operator=(RunFileLock&& other) noexcept {
  if (this != &other) {
    release();
    lock_file_ = std::move(other.lock_file_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

RunFileLock::~RunFileLock() { release(); }

void RunFileLock::release() noexcept {
  if (fd_ < 0) return;
  // A name removed by hand and made again by the next holder is not ours to remove.
  if (names_this_file(lock_file_, fd_)) ::unlink(lock_file_.c_str());
  ::close(fd_);  // closing the last descriptor releases the flock
  fd_ = -1;
}

}  // namespace scape::run_file
