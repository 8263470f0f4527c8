// Small RAII layer over the HDF5 C API shared by the run recorder and the gradient-trace
// reader: move-only handles, one process-wide lock, and errors naming the file and object.
// This header is the one to include: files are here, on top of the handles (hdf5_handle.hpp) and
// the groups, attributes and datasets (hdf5_object.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "run_file/hdf5_object.hpp"

namespace scape::run_file {

enum class Access {
  read,        // read-only; falls back to SWMR-read for a file a writer holds or a killed writer left
  read_write,  // read-write; refused while the superblock says another writer has it open
  recover,     // read-write after clearing a killed writer's "open for writing" superblock flags
};

class File : public Object {
 public:
  File() = default;
  // Creates or truncates, in the latest file format (the one SWMR needs).
  static File create(const std::filesystem::path& path);
  // Distinguishes a missing file and a non-HDF5 file in its errors.
  static File open(const std::filesystem::path& path, Access access);

  // Switches to SWMR-write: every flush leaves a consistent file. Attributes must all be
  // closed, and no attribute or object can be created afterwards.
  void start_swmr_write() const;
  void flush() const;
  // Makes sure the next `bytes` past HDF5's end of allocation can be written (posix_fallocate),
  // so that a full disk or a file-size limit stops the writer before HDF5 starts a flush it
  // cannot finish: a flush that fails half-way leaves metadata pointing past the end of the
  // file, which no reader opens. Throws H5Error naming the file and the system's reason.
  void reserve(std::uint64_t bytes) const;

 private:
  File(Handle handle, std::string file) : Object(std::move(handle), std::move(file), "/") {}
};

}  // namespace scape::run_file
