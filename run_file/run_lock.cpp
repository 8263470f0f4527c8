#include "run_file/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <sstream>
#include <system_error>
#include <utility>

namespace scape::run_file {

namespace {

bool names_this_file(const std::filesystem::path& name, int fd) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(name.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev;
}

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::optional<LockHolder> parse_holder(const std::string& text) {
  std::istringstream in(text);
  LockHolder h;
  if (!(in >> h.pid >> h.host) || h.pid <= 0) return std::nullopt;
  return h;
}

std::string read_fd(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// Records this process as the holder; a lock file only readable here (another user's) keeps
// what it says.
void write_holder(int fd) {
  const std::string text = std::to_string(::getpid()) + " " + this_host() + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, text.data(), text.size(), 0);
}

}  // namespace

std::string LockHolder::describe() const { return "pid " + std::to_string(pid) + " on host " + host; }

bool LockHolder::alive() const {
  if (host != this_host()) return true;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// The holder unlinks the lock file before it unlocks, so a waiter can end up holding a lock on
// a file that no longer has the name: it then opens the name again. Only a lock on the inode
// the name points at counts.
std::optional<RunFileLock> RunFileLock::take(const std::filesystem::path& run_file, bool wait) {
  std::filesystem::path lock_file = run_file;
  lock_file += ".lock";
  for (;;) {
    // flock needs no write access, so users sharing a folder can lock each other's files: one
    // that cannot be written is locked read-only (its holder then goes unnamed).
    int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && (errno == EACCES || errno == EROFS)) fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
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
    if (names_this_file(lock_file, fd)) {
      RunFileLock lock(lock_file, fd);
      // A holder that released its lock removed the file first: what the file still says is a
      // holder that ended without releasing it.
      lock.taken_over_ = parse_holder(read_fd(fd));
      write_holder(fd);
      return lock;
    }
    ::close(fd);  // the previous holder removed it meanwhile: lock the name's new file
  }
}

std::optional<RunFileLock> RunFileLock::try_acquire(const std::filesystem::path& run_file) {
  return take(run_file, false);
}

RunFileLock RunFileLock::acquire(const std::filesystem::path& run_file) { return std::move(*take(run_file, true)); }

RunFileLock RunFileLock::for_writing(const std::filesystem::path& run_file) {
  auto lock = take(run_file, false);
  if (lock) return std::move(*lock);
  const auto h = holder(run_file);
  throw RunFileBusy(run_file.string() + ": another process is writing it (" +
                    (h ? h->describe() : std::string("its lock file names no process")) + ", holding " +
                    run_file.string() + ".lock); two writers would corrupt the file: wait for it to end, or stop it");
}

std::string RunFileLock::taken_over_note() const {
  if (!taken_over_) return "";
  return lock_file_.string() + ": took over the lock of " + taken_over_->describe() +
         ", which ended without releasing it";
}

std::optional<LockHolder> RunFileLock::holder(const std::filesystem::path& run_file) {
  std::filesystem::path lock_file = run_file;
  lock_file += ".lock";
  const int fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const std::string text = read_fd(fd);
  ::close(fd);
  return parse_holder(text);
}

RunFileLock::RunFileLock(RunFileLock&& other) noexcept
    : lock_file_(std::move(other.lock_file_)),
      fd_(std::exchange(other.fd_, -1)),
      taken_over_(std::move(other.taken_over_)) {}

RunFileLock& RunFileLock::operator=(RunFileLock&& other) noexcept {
  if (this != &other) {
    release();
    lock_file_ = std::move(other.lock_file_);
    fd_ = std::exchange(other.fd_, -1);
    taken_over_ = std::move(other.taken_over_);
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
