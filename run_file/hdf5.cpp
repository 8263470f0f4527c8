// HDF5 files: creating and opening them (one a live or killed writer left marked open too),
// SWMR-write, flushes, and reserving disk space so that a full disk stops a writer between flushes.
#include "run_file/hdf5.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace scape::run_file {
namespace {

constexpr unsigned kSwmrReadAttempts = 24;

}  // namespace

File File::create(const std::filesystem::path& path) {
  const auto lock = lock_hdf5();
  const std::string name = path.string();
  const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl || H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0)
    throw_h5_error(name, "set up file access");
  Handle file(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file) throw_h5_error(name, "create the file");
  return File(std::move(file), name);
}

File File::open(const std::filesystem::path& path, Access access) {
  const auto lock = lock_hdf5();
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw_invalid_file(name, "no such file");
  const htri_t is_hdf5 = H5Fis_hdf5(name.c_str());
  if (is_hdf5 < 0) throw_h5_error(name, "read the file signature");
  if (is_hdf5 == 0) throw_invalid_file(name, "not an HDF5 file");

  Handle file;
  if (access == Access::read) {
    file = Handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file) {
      // A live SWMR writer, or one that was killed, leaves the superblock marked "open for
      // writing"; plain readers are refused but SWMR readers see every flushed state.
      const std::string plain_failure = error_stack_detail();
      // HDF5 retries a metadata read whose checksum fails 100 times by default in SWMR mode,
      // sleeping between tries doubling up to an hour: a damaged file held a reader for hours.
      // 24 tries wait at most 2^24 ns (17 ms) per block, still time for a live writer to finish
      // writing one (analysis/runs.py bounds its SWMR opens the same way).
      const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
      if (!fapl || H5Pset_metadata_read_attempts(fapl.get(), kSwmrReadAttempts) < 0)
        throw_h5_error(name, "set up file access");
      file = Handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get()), H5Fclose);
      if (!file) {
        H5Eclear2(H5E_DEFAULT);
        throw_invalid_file(name, "cannot open the file for reading (" + plain_failure + ")");
      }
    }
  } else {
    const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (!fapl) throw_h5_error(name, "set up file access");
    if (access == Access::recover) {
      // What `h5clear -s` does: "clear_status_flags" is a library-private file-access
      // property (present through the 1.10 and 1.12 series); opening with it drops the flags a
      // killed writer left, which otherwise refuse every read-write open.
      hbool_t clear = 1;
      if (H5Pexist(fapl.get(), "clear_status_flags") <= 0 || H5Pset(fapl.get(), "clear_status_flags", &clear) < 0)
        throw_h5_error(name, "request clearing the superblock status flags");
    }
    file = Handle(H5Fopen(name.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose);
    if (!file) throw_h5_error(name, "open the file for writing");
  }
  return File(std::move(file), name);
}

void File::start_swmr_write() const {
  const auto lock = lock_hdf5();
  if (H5Fstart_swmr_write(id()) < 0) throw_h5_error(file_, "start SWMR-write mode");
}

void File::flush() const {
  const auto lock = lock_hdf5();
  if (H5Fflush(id(), H5F_SCOPE_GLOBAL) < 0) throw_h5_error(file_, "flush");
}

void File::reserve(std::uint64_t bytes) const {
  const auto lock = lock_hdf5();
  if (bytes == 0) return;
  haddr_t eoa = 0;
  if (H5Fget_eoa(id(), &eoa) < 0) throw_h5_error(file_, "read the end of its allocated space");
  // Allocating from HDF5's end of allocation (not the file's size) keeps repeated reservations
  // from growing the file: HDF5 writes into the reserved bytes, and its flush truncates the rest.
  const int fd = ::open(file_.c_str(), O_WRONLY | O_CLOEXEC);
  const int error = fd < 0 ? errno : ::posix_fallocate(fd, static_cast<off_t>(eoa), static_cast<off_t>(bytes));
  if (fd >= 0) ::close(fd);
  if (error != 0)
    throw_invalid_file(file_,
                       "no room to write " + std::to_string(bytes) + " more bytes (" + std::strerror(error) + ")");
}

}  // namespace scape::run_file
