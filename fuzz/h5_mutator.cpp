// The edits of h5_mutator.hpp, made with the HDF5 C API. Every HDF5 failure is ignored: an
// edit the library refuses (a dataset under a missing group, a resize past the maximum) is
// simply not made.
#include "fuzz/h5_mutator.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstring>

#include "run_file/hdf5.hpp"

namespace scape::fuzz {
namespace {

constexpr int kMaxEdits = 8;
constexpr hsize_t kMaxWrittenElements = 4096;

template <typename T>
const T& pick(FuzzedDataProvider& in, const std::vector<T>& items) {
  return items[in.ConsumeIntegralInRange<std::size_t>(0, items.size() - 1)];
}

std::string pick_string(FuzzedDataProvider& in, const H5Vocabulary& v) {
  if (!v.strings.empty() && in.ConsumeBool()) return pick(in, v.strings);
  return in.ConsumeRandomLengthString(64);
}

hid_t string_type(bool variable) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, variable ? H5T_VARIABLE : 8);
  return t;
}

// A file type and the matching memory type for the values written.
struct TypePair {
  hid_t file, memory;
  bool is_string, owned;
};

TypePair pick_type(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 6)) {
    case 0: return {H5T_STD_I8LE, H5T_NATIVE_INT8, false, false};
    case 1: return {H5T_STD_I64LE, H5T_NATIVE_INT64, false, false};
    case 2: return {H5T_STD_U8LE, H5T_NATIVE_UINT8, false, false};
    case 3: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, false, false};
    case 4: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, false, false};
    case 5: {
      const hid_t t = string_type(true);
      return {t, t, true, true};
    }
    default: {
      const hid_t t = string_type(false);
      return {t, t, true, true};
    }
  }
}

// Writes every element of `object` (dataset or attribute, `count` elements) from the input.
template <typename Write>
void fill(FuzzedDataProvider& in, const H5Vocabulary& v, const TypePair& type, hsize_t count, Write&& write) {
  if (count == 0 || count > kMaxWrittenElements) return;
  if (type.is_string) {
    std::vector<std::string> values(count);
    for (auto& s : values) s = pick_string(in, v);
    if (H5Tis_variable_str(type.memory) > 0) {
      std::vector<const char*> pointers;
      for (const auto& s : values) pointers.push_back(s.c_str());
      write(type.memory, pointers.data());
    } else {
      std::vector<char> fixed(count * 8, '\0');
      for (hsize_t i = 0; i < count; ++i)
        std::memcpy(&fixed[i * 8], values[i].data(), std::min<std::size_t>(8, values[i].size()));
      write(type.memory, fixed.data());
    }
    return;
  }
  const std::size_t bytes = count * H5Tget_size(type.memory);
  std::vector<std::uint8_t> raw = in.ConsumeBytes<std::uint8_t>(bytes);
  raw.resize(bytes);
  write(type.memory, raw.data());
}

void replace_dataset(hid_t file, FuzzedDataProvider& in, const H5Vocabulary& v) {
  const std::string& path = pick(in, v.objects);
  H5Ldelete(file, path.c_str(), H5P_DEFAULT);
  const TypePair type = pick_type(in);
  const int rank = in.ConsumeIntegralInRange(0, 3);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(dims.size()), chunk(dims.size());
  const bool extensible = rank > 0 && in.ConsumeBool();
  for (int d = 0; d < rank; ++d) {
    // Small, or along the first dimension sometimes huge, which a chunked dataset claims
    // without storing; its chunks stay few (at most 4096), or HDF5 itself would spend seconds
    // walking their index (deleting the dataset, say).
    const bool huge = d == 0 && in.ConsumeBool();
    dims[d] = huge ? in.ConsumeIntegral<std::uint32_t>() : in.ConsumeIntegralInRange<hsize_t>(0, 6);
    max_dims[d] = extensible ? H5S_UNLIMITED : dims[d];
    chunk[d] = huge ? std::clamp<hsize_t>(dims[d] >> 12, 1, hsize_t{1} << 20)
                    : std::max<hsize_t>(1, std::min<hsize_t>(dims[d], 4));
  }
  const bool chunked = extensible || std::any_of(dims.begin(), dims.end(), [](hsize_t d) { return d > 4096; });
  const hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), max_dims.data());
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunked) H5Pset_chunk(dcpl, rank, chunk.data());
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  const hid_t dataset = H5Dcreate2(file, path.c_str(), type.file, space, lcpl, dcpl, H5P_DEFAULT);
  if (dataset >= 0) {
    const hssize_t count = H5Sget_simple_extent_npoints(space);
    fill(in, v, type, count < 0 ? 0 : static_cast<hsize_t>(count),
         [&](hid_t memory, const void* buffer) { H5Dwrite(dataset, memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer); });
    H5Dclose(dataset);
  }
  H5Pclose(lcpl);
  H5Pclose(dcpl);
  H5Sclose(space);
  if (type.owned) H5Tclose(type.file);
}

void rewrite_attribute(hid_t file, FuzzedDataProvider& in, const H5Vocabulary& v) {
  const std::string object = in.ConsumeBool() ? "/" : pick(in, v.objects);
  const std::string& name = pick(in, v.attributes);
  const hid_t target = H5Oopen(file, object.c_str(), H5P_DEFAULT);
  if (target < 0) return;
  H5Adelete(target, name.c_str());
  if (in.ConsumeIntegralInRange(0, 5) > 0) {
    const TypePair type = pick_type(in);
    const hsize_t n = in.ConsumeIntegralInRange<hsize_t>(1, 2);
    const hid_t space = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
    const hid_t attr = H5Acreate2(target, name.c_str(), type.file, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr >= 0) {
      fill(in, v, type, n, [&](hid_t memory, const void* buffer) { H5Awrite(attr, memory, buffer); });
      H5Aclose(attr);
    }
    H5Sclose(space);
    if (type.owned) H5Tclose(type.file);
  }
  H5Oclose(target);
}

void resize_dataset(hid_t file, FuzzedDataProvider& in, const H5Vocabulary& v) {
  const hid_t dataset = H5Dopen2(file, pick(in, v.objects).c_str(), H5P_DEFAULT);
  if (dataset < 0) return;
  const hid_t space = H5Dget_space(dataset);
  hsize_t dims[H5S_MAX_RANK] = {};
  const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
  if (rank > 0) {
    dims[0] = in.ConsumeIntegralInRange<hsize_t>(0, 2 * dims[0] + 3);
    H5Dset_extent(dataset, dims);
  }
  H5Sclose(space);
  H5Dclose(dataset);
}

void overwrite_value(hid_t file, FuzzedDataProvider& in, const H5Vocabulary& v) {
  const hid_t dataset = H5Dopen2(file, pick(in, v.objects).c_str(), H5P_DEFAULT);
  if (dataset < 0) return;
  const hid_t space = H5Dget_space(dataset);
  const hid_t type = H5Dget_type(dataset);
  const hssize_t count = H5Sget_simple_extent_npoints(space);
  const H5T_class_t cls = H5Tget_class(type);
  if (count > 0 && (cls == H5T_INTEGER || cls == H5T_FLOAT)) {
    const hsize_t index = in.ConsumeIntegralInRange<hsize_t>(0, static_cast<hsize_t>(count - 1));
    hsize_t dims[H5S_MAX_RANK] = {}, start[H5S_MAX_RANK] = {}, one[H5S_MAX_RANK];
    const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
    hsize_t rest = index;
    for (int d = rank - 1; d >= 0; --d) {
      start[d] = rest % dims[d];
      rest /= dims[d];
      one[d] = 1;
    }
    const hid_t memory = cls == H5T_FLOAT ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64;
    std::uint8_t value[8] = {};
    const auto bytes = in.ConsumeBytes<std::uint8_t>(8);
    if (!bytes.empty()) std::memcpy(value, bytes.data(), bytes.size());
    const hsize_t single = 1;
    const hid_t memory_space = H5Screate_simple(1, &single, nullptr);
    if (rank == 0 || H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, one, nullptr) >= 0)
      H5Dwrite(dataset, memory, memory_space, rank == 0 ? H5S_ALL : space, H5P_DEFAULT, value);
    H5Sclose(memory_space);
  }
  H5Tclose(type);
  H5Sclose(space);
  H5Dclose(dataset);
}

void replace_by_group(hid_t file, FuzzedDataProvider& in, const H5Vocabulary& v) {
  const std::string& path = pick(in, v.objects);
  H5Ldelete(file, path.c_str(), H5P_DEFAULT);
  const hid_t group = H5Gcreate2(file, path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (group >= 0) H5Gclose(group);
}

}  // namespace

void keep_hdf5_free_lists() {
  const auto lock = run_file::lock_hdf5();
  // Bounded, so a long run's memory stays flat: fixed-size structs (the cache among them) up to
  // 8 MB per list, 64 MB in all; blocks up to 4 MB per size, 64 MB in all; arrays as default.
  constexpr int kMiB = 1 << 20;
  H5set_free_list_limits(64 * kMiB, 8 * kMiB, 4 * kMiB, kMiB / 4, 64 * kMiB, 4 * kMiB);
}

void mutate_hdf5(const std::filesystem::path& path, FuzzedDataProvider& input, const H5Vocabulary& vocabulary) {
  const auto lock = run_file::lock_hdf5();  // also silences HDF5's error printing
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 64 * 1024, /*backing_store=*/1);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  if (file < 0) return;
  for (int edit = 0; edit < kMaxEdits && input.remaining_bytes() > 0; ++edit) {
    switch (input.ConsumeIntegralInRange(0, 5)) {
      case 0: H5Ldelete(file, pick(input, vocabulary.objects).c_str(), H5P_DEFAULT); break;
      case 1: replace_dataset(file, input, vocabulary); break;
      case 2: rewrite_attribute(file, input, vocabulary); break;
      case 3: resize_dataset(file, input, vocabulary); break;
      case 4: overwrite_value(file, input, vocabulary); break;
      default: replace_by_group(file, input, vocabulary); break;
    }
  }
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
}

}  // namespace scape::fuzz
