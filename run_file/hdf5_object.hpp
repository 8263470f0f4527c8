// What an HDF5 file holds, for the wrapper (run_file/hdf5.hpp): groups and attributes, and
// datasets read and written by hyperslab, each remembering its file and path for messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "run_file/hdf5_handle.hpp"

namespace scape::run_file {

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
  // Unlinks `path` (its space is not reclaimed; not in SWMR-write mode).
  void remove_link(const std::string& path) const;
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

}  // namespace scape::run_file
