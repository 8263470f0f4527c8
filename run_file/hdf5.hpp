// Small RAII layer over the HDF5 C API shared by the run recorder and the gradient-trace
// reader: move-only handles, one process-wide lock, and errors naming the file and object.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace scape::experiments {

// Every failing HDF5 call (and every malformed file) surfaces as this, with the file path and
// the object or attribute in the message.
class H5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// HDF5 serial is not thread-safe, so every HDF5 call of the process runs under this one lock.
// It is recursive because handle destructors (H5*close) run inside locked sections. Code that
// calls the C API directly while other threads may use HDF5 must hold it too. First use also
// turns off HDF5's own error-stack printing: failures are reported through H5Error instead.
std::recursive_mutex& hdf5_mutex();

// 'name' in single quotes, for error messages that name files, datasets and attributes.
std::string in_quotes(std::string_view s);
[[nodiscard]] std::unique_lock<std::recursive_mutex> lock_hdf5();

// Throws H5Error "HDF5 file '<file>': cannot <what>: <innermost HDF5 message>".
[[noreturn]] void throw_h5_error(std::string_view file, std::string_view what);
// Throws H5Error "HDF5 file '<file>': <problem>" for files that open but have the wrong shape.
[[noreturn]] void throw_invalid_file(std::string_view file, std::string_view problem);

// Owns one hid_t and releases it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) noexcept : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  hid_t get() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ >= 0; }
  // Releases now; returns the H5*close status (destructors ignore it).
  herr_t close() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// The in-memory HDF5 type of T (float, double, std::int64_t, std::uint8_t).
template <typename T>
hid_t native_type();
template <>
hid_t native_type<float>();
template <>
hid_t native_type<double>();
template <>
hid_t native_type<std::int64_t>();
template <>
hid_t native_type<std::uint8_t>();

struct DatasetShape {
  std::vector<hsize_t> dims;
  std::vector<hsize_t> max_dims;  // empty: same as dims; H5S_UNLIMITED where a dimension grows
  std::vector<hsize_t> chunk;     // empty: contiguous layout
  std::optional<double> fill;     // value read back for never-written elements
};

class Dataset;

// An open file, group or dataset that remembers its file path and object path for messages.
class Object {
 public:
  Object() = default;
  Object(Handle handle, std::string file, std::string name)
      : handle_(std::move(handle)), file_(std::move(file)), name_(std::move(name)) {}

  hid_t id() const noexcept { return handle_.get(); }
  const std::string& file_path() const noexcept { return file_; }
  const std::string& name() const noexcept { return name_; }
  // Closes now and throws when HDF5 reports a failure (destructors cannot).
  void close();

  bool has_attribute(const std::string& attr) const;
  // Creates the attribute when absent and rewrites it when present (rewriting is allowed in
  // SWMR-write mode, creating is not). Strings are variable-length UTF-8, integers int64.
  void write_string_attribute(const std::string& attr, std::string_view value) const;
  void write_int_attribute(const std::string& attr, std::int64_t value) const;
  std::string read_string_attribute(const std::string& attr) const;
  std::int64_t read_int_attribute(const std::string& attr) const;

  // `path` is relative to this object; every intermediate group must exist for true.
  bool has_link(const std::string& path) const;
  std::vector<std::string> child_names(const std::string& group_path) const;
  // Creates missing intermediate groups.
  Object create_group(const std::string& path) const;
  Dataset create_dataset(const std::string& path, hid_t file_type, const DatasetShape& shape) const;
  // A fixed 1-D dataset of variable-length UTF-8 strings.
  Dataset create_string_dataset(const std::string& path, std::span<const std::string> values) const;
  // Throws H5Error naming the file and the missing dataset when absent.
  Dataset open_dataset(const std::string& path) const;

 protected:
  std::string child_path(const std::string& path) const;

  Handle handle_;
  std::string file_;
  std::string name_;
};

class Dataset : public Object {
 public:
  using Object::Object;

  std::vector<hsize_t> dims() const;
  // The chunk shape; empty for a contiguous dataset.
  std::vector<hsize_t> chunk_dims() const;
  H5T_class_t type_class() const;
  void set_extent(const std::vector<hsize_t>& dims) const;

  // Hyperslab transfer of the block at `start` with extent `count` (row-major in memory).
  template <typename T>
  void write(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, std::span<const T> data) const {
    write_raw(start, count, native_type<T>(), data.data(), data.size());
  }
  template <typename T>
  void read(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, std::span<T> out) const {
    read_raw(start, count, native_type<T>(), out.data(), out.size());
  }
  template <typename T>
  std::vector<T> read_all() const {
    const std::vector<hsize_t> extent = dims();
    std::vector<T> out(element_count(extent));
    read<T>(std::vector<hsize_t>(extent.size(), 0), extent, std::span<T>(out));
    return out;
  }
  // Sets dimension 0 to first_row + rows and writes `data` (rows x the other dimensions) from
  // first_row on. Writing at an explicit row makes a retried flush idempotent.
  template <typename T>
  void write_rows(hsize_t first_row, std::span<const T> data) const {
    std::vector<hsize_t> extent = dims();
    const hsize_t rows = rows_of(extent, data.size());
    extent[0] = first_row + rows;
    set_extent(extent);
    std::vector<hsize_t> start(extent.size(), 0), count = extent;
    start[0] = first_row;
    count[0] = rows;
    write<T>(start, count, data);
  }
  // A 1-D dataset of fixed- or variable-length strings; one claiming more than max_count (a
  // corrupt extent, which nothing would allocate) is refused with an H5Error.
  std::vector<std::string> read_strings(std::size_t max_count = std::size_t{1} << 24) const;

  static std::size_t element_count(const std::vector<hsize_t>& dims);

 private:
  // The file and memory dataspaces of a checked hyperslab; both empty when it has no elements.
  struct Selection {
    Handle file_space, mem_space;
  };
  Selection select(std::string_view action, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                   std::size_t elements) const;
  void write_raw(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, hid_t mem_type,
                 const void* data, std::size_t elements) const;
  void read_raw(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, hid_t mem_type, void* out,
                std::size_t elements) const;
  hsize_t rows_of(const std::vector<hsize_t>& dims, std::size_t elements) const;
};

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

}  // namespace scape::experiments
