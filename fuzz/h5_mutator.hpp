// Structure-aware edits of an HDF5 file for the reader fuzz targets: the input picks edits
// (delete an object, replace a dataset by one of another type / shape / content, rewrite an
// attribute, resize, overwrite values) and they are made through the HDF5 library on a copy
// of a valid file. So the targets fuzz our readers on top of HDF5 (every shape, type and value
// a file can hold), not HDF5's own parser. The edits are made in memory (HDF5's core driver:
// one read of the file, one write of the result), not through HDF5's many small file I/Os.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

namespace scape::fuzz {

// The names the edits draw from: the reader's own dataset paths and attributes, and strings
// it gives meaning to (statuses, configs).
struct H5Vocabulary {
  std::vector<std::string> objects;     // paths relative to the root, e.g. "metrics/step"
  std::vector<std::string> attributes;  // on the root or on an object
  std::vector<std::string> strings;
};

// Lets HDF5 keep more of the memory it frees for reuse (larger free-list limits). Every file
// open allocates a metadata cache of about a megabyte; past the default limits HDF5 returns it
// to the system at close, and the next open pays for mapping and zeroing fresh pages. Call
// once, from LLVMFuzzerInitialize.
void keep_hdf5_free_lists();

// LLVMFuzzerInitialize of a target that mutates a template file: keep_hdf5_free_lists, then
// build the template once (template_bytes caches it), before the first input is timed.
inline int initialize_hdf5_target(const std::string& (*template_bytes)()) {
  keep_hdf5_free_lists();
  (void)template_bytes();
  return 0;
}

// Applies the input's edits to `file` (which must exist and open read-write).
void mutate_hdf5(const std::filesystem::path& file, FuzzedDataProvider& input, const H5Vocabulary& vocabulary);

}  // namespace scape::fuzz
