// Attributes, links, groups and datasets: every read and write of a file's contents, each under
// the HDF5 lock, with strings read whether the writer stored them variable- or fixed-length.
#include "run_file/hdf5_object.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

namespace scape::run_file {

namespace {

Handle variable_string_type(const std::string& file) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type || H5Tset_size(type.get(), H5T_VARIABLE) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    throw_h5_error(file, "build a variable-length string type");
  return type;
}

Handle scalar_space(const std::string& file) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (!space) throw_h5_error(file, "create a scalar dataspace");
  return space;
}

// Reads a string stored either as one variable-length string or as a fixed-size one.
// `read(mem_type, buffer)` performs the H5Aread / H5Dread.
std::vector<std::string> read_string_values(hid_t file_type, hid_t space, std::size_t count,
                                            const std::function<herr_t(hid_t, void*)>& read, const std::string& file,
                                            const std::string& what) {
  Handle mem_type(H5Tcopy(file_type), H5Tclose);
  if (!mem_type) throw_h5_error(file, "copy the string type of " + what);
  std::vector<std::string> out;
  out.reserve(count);
  const htri_t variable = H5Tis_variable_str(file_type);
  if (variable < 0) throw_h5_error(file, "inspect the string type of " + what);
  if (variable > 0) {
    std::vector<char*> pointers(count, nullptr);
    if (read(mem_type.get(), pointers.data()) < 0) throw_h5_error(file, "read " + what);
    for (char* p : pointers) out.emplace_back(p != nullptr ? p : "");
    H5Dvlen_reclaim(mem_type.get(), space, H5P_DEFAULT, pointers.data());
    return out;
  }
  const std::size_t width = H5Tget_size(file_type);
  std::vector<char> buffer(width * count);
  if (count > 0 && read(mem_type.get(), buffer.data()) < 0) throw_h5_error(file, "read " + what);
  const bool space_padded = H5Tget_strpad(file_type) == H5T_STR_SPACEPAD;
  for (std::size_t i = 0; i < count; ++i) {
    const char* begin = buffer.data() + i * width;
    std::string s(begin, strnlen(begin, width));
    if (space_padded) s.erase(s.find_last_not_of(' ') + 1);
    out.push_back(std::move(s));
  }
  return out;
}

// An attribute holding one value of the expected class, open with its type and dataspace.
struct ScalarAttribute {
  Handle handle, type, space;
};

ScalarAttribute open_scalar_attribute(hid_t object, const std::string& attr, const std::string& file,
                                      const std::string& what, H5T_class_t expected, const char* kind) {
  ScalarAttribute a;
  a.handle = Handle(H5Aopen(object, attr.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.handle) throw_h5_error(file, "open " + what);
  a.type = Handle(H5Aget_type(a.handle.get()), H5Tclose);
  a.space = Handle(H5Aget_space(a.handle.get()), H5Sclose);
  if (!a.type || !a.space) throw_h5_error(file, "inspect " + what);
  const std::string article = std::string("aeiou").find(kind[0]) == std::string::npos ? "a " : "an ";
  if (H5Tget_class(a.type.get()) != expected) throw_invalid_file(file, what + " is not " + article + kind);
  if (H5Sget_simple_extent_npoints(a.space.get()) != 1) throw_invalid_file(file, what + " is not a single " + kind);
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Object

void Object::close() {
  if (handle_.close() < 0) throw_h5_error(file_, "close " + in_quotes(name_));
}

std::string Object::child_path(const std::string& path) const {
  if (!path.empty() && path.front() == '/') return path;
  return name_ == "/" || name_.empty() ? "/" + path : name_ + "/" + path;
}

bool Object::has_attribute(const std::string& attr) const {
  const auto lock = lock_hdf5();
  const htri_t exists = H5Aexists(id(), attr.c_str());
  if (exists < 0) throw_h5_error(file_, "look up attribute " + in_quotes(attr) + " of " + in_quotes(name_));
  return exists > 0;
}

void Object::write_string_attribute(const std::string& attr, std::string_view value) const {
  const auto lock = lock_hdf5();
  const std::string what = "write attribute " + in_quotes(attr) + " of " + in_quotes(name_);
  const Handle type = variable_string_type(file_);
  Handle handle;
  if (has_attribute(attr)) {
    // An existing attribute of another shape would make H5Awrite read past the one value.
    handle = open_scalar_attribute(id(), attr, file_, what, H5T_STRING, "string").handle;
  } else {
    const Handle space = scalar_space(file_);
    handle = Handle(H5Acreate2(id(), attr.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  }
  const std::string text(value);
  const char* pointer = text.c_str();
  if (!handle || H5Awrite(handle.get(), type.get(), &pointer) < 0) throw_h5_error(file_, what);
  if (handle.close() < 0) throw_h5_error(file_, what);
}

void Object::write_int_attribute(const std::string& attr, std::int64_t value) const {
  const auto lock = lock_hdf5();
  const std::string what = "write attribute " + in_quotes(attr) + " of " + in_quotes(name_);
  Handle handle;
  if (has_attribute(attr)) {
    handle = open_scalar_attribute(id(), attr, file_, what, H5T_INTEGER, "integer").handle;
  } else {
    const Handle space = scalar_space(file_);
    handle = Handle(H5Acreate2(id(), attr.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  }
  if (!handle || H5Awrite(handle.get(), H5T_NATIVE_INT64, &value) < 0) throw_h5_error(file_, what);
  if (handle.close() < 0) throw_h5_error(file_, what);
}

std::string Object::read_string_attribute(const std::string& attr) const {
  const auto lock = lock_hdf5();
  const std::string what = "attribute " + in_quotes(attr) + " of " + in_quotes(name_);
  const ScalarAttribute a = open_scalar_attribute(id(), attr, file_, what, H5T_STRING, "string");
  const auto read = [&](hid_t mem_type, void* buffer) { return H5Aread(a.handle.get(), mem_type, buffer); };
  return read_string_values(a.type.get(), a.space.get(), 1, read, file_, what).front();
}

std::int64_t Object::read_int_attribute(const std::string& attr) const {
  const auto lock = lock_hdf5();
  const std::string what = "attribute " + in_quotes(attr) + " of " + in_quotes(name_);
  const ScalarAttribute a = open_scalar_attribute(id(), attr, file_, what, H5T_INTEGER, "integer");
  std::int64_t value = 0;
  if (H5Aread(a.handle.get(), H5T_NATIVE_INT64, &value) < 0) throw_h5_error(file_, "read " + what);
  return value;
}

void Object::remove_link(const std::string& path) const {
  const auto lock = lock_hdf5();
  if (H5Ldelete(id(), path.c_str(), H5P_DEFAULT) < 0) throw_h5_error(file_, "remove " + in_quotes(child_path(path)));
}

bool Object::has_link(const std::string& path) const {
  const auto lock = lock_hdf5();
  // H5Lexists fails rather than answering false when an intermediate group is missing, so
  // walk the path one component at a time.
  std::string prefix;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    const std::size_t end = std::min(path.find('/', begin), path.size());
    if (end > begin) {
      if (!prefix.empty()) prefix += '/';
      prefix.append(path, begin, end - begin);
      const htri_t exists = H5Lexists(id(), prefix.c_str(), H5P_DEFAULT);
      if (exists < 0) throw_h5_error(file_, "look up " + in_quotes(child_path(prefix)));
      if (exists == 0) return false;
    }
    begin = end + 1;
  }
  return true;
}

std::vector<std::string> Object::child_names(const std::string& group_path) const {
  const auto lock = lock_hdf5();
  std::vector<std::string> names;
  const auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  if (H5Literate_by_name(id(), group_path.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names,
                         H5P_DEFAULT) < 0)
    throw_h5_error(file_, "list the members of " + in_quotes(child_path(group_path)));
  return names;
}

Object Object::create_group(const std::string& path) const {
  const auto lock = lock_hdf5();
  const Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!lcpl || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    throw_h5_error(file_, "set up the creation of group " + in_quotes(child_path(path)));
  Handle group(H5Gcreate2(id(), path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!group) throw_h5_error(file_, "create group " + in_quotes(child_path(path)));
  return Object(std::move(group), file_, child_path(path));
}

Dataset Object::create_dataset(const std::string& path, hid_t file_type, const DatasetShape& shape) const {
  const auto lock = lock_hdf5();
  const std::string what = "create dataset " + in_quotes(child_path(path));
  const std::vector<hsize_t>& max_dims = shape.max_dims.empty() ? shape.dims : shape.max_dims;
  const Handle space(H5Screate_simple(static_cast<int>(shape.dims.size()), shape.dims.data(), max_dims.data()),
                     H5Sclose);
  const Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!space || !dcpl || !lcpl || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0) throw_h5_error(file_, what);
  if (!shape.chunk.empty() && H5Pset_chunk(dcpl.get(), static_cast<int>(shape.chunk.size()), shape.chunk.data()) < 0)
    throw_h5_error(file_, what);
  if (shape.fill && H5Pset_fill_value(dcpl.get(), H5T_NATIVE_DOUBLE, &*shape.fill) < 0) throw_h5_error(file_, what);
  Handle dataset(H5Dcreate2(id(), path.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                 H5Dclose);
  if (!dataset) throw_h5_error(file_, what);
  return Dataset(std::move(dataset), file_, child_path(path));
}

Dataset Object::create_string_dataset(const std::string& path, std::span<const std::string> values) const {
  const auto lock = lock_hdf5();
  const Handle type = variable_string_type(file_);
  Dataset dataset = create_dataset(path, type.get(), DatasetShape{{values.size()}, {}, {}, {}});
  std::vector<const char*> pointers;
  for (const std::string& v : values) pointers.push_back(v.c_str());
  if (!values.empty() && H5Dwrite(dataset.id(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()) < 0)
    throw_h5_error(file_, "write dataset " + in_quotes(dataset.name()));
  return dataset;
}

Dataset Object::open_dataset(const std::string& path) const {
  const auto lock = lock_hdf5();
  if (!has_link(path)) throw_invalid_file(file_, "missing dataset " + in_quotes(child_path(path)));
  Handle dataset(H5Dopen2(id(), path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset) throw_h5_error(file_, "open dataset " + in_quotes(child_path(path)));
  return Dataset(std::move(dataset), file_, child_path(path));
}

// ---------------------------------------------------------------------------------------------
// Dataset

std::size_t Dataset::element_count(const std::vector<hsize_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), std::size_t{1},
                         [](std::size_t a, hsize_t b) { return a * static_cast<std::size_t>(b); });
}

std::vector<hsize_t> Dataset::dims() const {
  const auto lock = lock_hdf5();
  const Handle space(H5Dget_space(id()), H5Sclose);
  const int rank = space ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank < 0) throw_h5_error(file_, "read the dimensions of " + in_quotes(name_));
  std::vector<hsize_t> out(static_cast<std::size_t>(rank));
  if (H5Sget_simple_extent_dims(space.get(), out.data(), nullptr) < 0)
    throw_h5_error(file_, "read the dimensions of " + in_quotes(name_));
  return out;
}

std::vector<hsize_t> Dataset::chunk_dims() const {
  const auto lock = lock_hdf5();
  const Handle dcpl(H5Dget_create_plist(id()), H5Pclose);
  if (!dcpl) throw_h5_error(file_, "read the creation properties of " + in_quotes(name_));
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return {};
  std::vector<hsize_t> chunk(H5S_MAX_RANK);
  const int rank = H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, chunk.data());
  if (rank < 0) throw_h5_error(file_, "read the chunk shape of " + in_quotes(name_));
  chunk.resize(static_cast<std::size_t>(rank));
  return chunk;
}

H5T_class_t Dataset::type_class() const {
  const auto lock = lock_hdf5();
  const Handle type(H5Dget_type(id()), H5Tclose);
  const H5T_class_t cls = type ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  if (cls == H5T_NO_CLASS) throw_h5_error(file_, "read the element type of " + in_quotes(name_));
  return cls;
}

void Dataset::set_extent(const std::vector<hsize_t>& dims) const {
  const auto lock = lock_hdf5();
  if (H5Dset_extent(id(), dims.data()) < 0) throw_h5_error(file_, "resize " + in_quotes(name_));
}

hsize_t Dataset::rows_of(const std::vector<hsize_t>& dims, std::size_t elements) const {
  if (dims.empty()) throw_invalid_file(file_, in_quotes(name_) + " is a scalar, not a table of rows");
  const std::size_t row = element_count(std::vector<hsize_t>(dims.begin() + 1, dims.end()));
  if (row == 0 || elements % row != 0)
    throw_invalid_file(file_, std::to_string(elements) + " values are not whole rows of " + in_quotes(name_));
  return elements / row;
}

Dataset::Selection Dataset::select(std::string_view action, const std::vector<hsize_t>& start,
                                   const std::vector<hsize_t>& count, std::size_t elements) const {
  const std::string what = std::string(action) + " " + in_quotes(name_);
  const std::vector<hsize_t> extent = dims();
  if (start.size() != extent.size() || count.size() != extent.size())
    throw_invalid_file(file_, what + ": selection rank differs from the dataset rank");
  for (std::size_t d = 0; d < extent.size(); ++d)
    if (start[d] + count[d] > extent[d]) throw_invalid_file(file_, what + ": selection beyond the dataset extent");
  if (element_count(count) != elements)
    throw_invalid_file(file_, what + ": buffer size does not match the selection");
  if (elements == 0) return {};
  Selection selection{Handle(H5Dget_space(id()), H5Sclose), {}};
  const hsize_t n = elements;
  selection.mem_space = Handle(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (!selection.file_space || !selection.mem_space ||
      H5Sselect_hyperslab(selection.file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) <
          0)
    throw_h5_error(file_, "select the hyperslab to " + what);
  return selection;
}

void Dataset::write_raw(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, hid_t mem_type,
                        const void* data, std::size_t elements) const {
  const auto lock = lock_hdf5();
  const Selection s = select("write", start, count, elements);
  if (s.mem_space && H5Dwrite(id(), mem_type, s.mem_space.get(), s.file_space.get(), H5P_DEFAULT, data) < 0)
    throw_h5_error(file_, "write " + in_quotes(name_));
}

void Dataset::read_raw(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, hid_t mem_type,
                       void* out, std::size_t elements) const {
  const auto lock = lock_hdf5();
  const Selection s = select("read", start, count, elements);
  if (s.mem_space && H5Dread(id(), mem_type, s.mem_space.get(), s.file_space.get(), H5P_DEFAULT, out) < 0)
    throw_h5_error(file_, "read " + in_quotes(name_));
}

std::vector<std::string> Dataset::read_strings(std::size_t max_count) const {
  const auto lock = lock_hdf5();
  const std::vector<hsize_t> extent = dims();
  if (extent.size() != 1) throw_invalid_file(file_, in_quotes(name_) + " must be a 1-D list of strings");
  if (extent[0] > max_count)
    throw_invalid_file(file_, in_quotes(name_) + " holds " + std::to_string(extent[0]) + " strings, more than the " +
                                  std::to_string(max_count) + " it may");
  const Handle type(H5Dget_type(id()), H5Tclose);
  const Handle space(H5Dget_space(id()), H5Sclose);
  if (!type || !space) throw_h5_error(file_, "inspect " + in_quotes(name_));
  if (H5Tget_class(type.get()) != H5T_STRING) throw_invalid_file(file_, in_quotes(name_) + " is not a string dataset");
  const auto read = [&](hid_t mem_type, void* buffer) {
    return H5Dread(id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer);
  };
  return read_string_values(type.get(), space.get(), extent[0], read, file_, "dataset " + in_quotes(name_));
}

}  // namespace scape::run_file
