// CRC-32 over a run file's per-step tables (table_checksums.hpp).
#include "run_file/table_checksums.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "run_file/hdf5.hpp"

namespace scape::run_file {
namespace {

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> kTable = make_table();

// The CRC of `values` as little-endian bytes.
template <typename T>
std::uint32_t crc_of(const std::vector<T>& values) {
  std::vector<unsigned char> bytes(values.size() * sizeof(T));
  if (bytes.empty()) return crc32(bytes);  // an empty table's data() may be null, which memcpy may not take
  std::memcpy(bytes.data(), values.data(), bytes.size());
  if constexpr (std::endian::native == std::endian::big) {
    for (std::size_t i = 0; i < bytes.size(); i += sizeof(T))
      for (std::size_t a = 0, b = sizeof(T) - 1; a < b; ++a, --b) std::swap(bytes[i + a], bytes[i + b]);
  }
  return crc32(bytes);
}

std::uint32_t table_crc(const Dataset& d) {
  // A corrupt extent is refused before its values are allocated.
  double values = 1;  // in double: a corrupt extent's product may not fit 64 bits
  for (const hsize_t x : d.dims()) values *= static_cast<double>(x);
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(d.file_path(), ec);
  if (!ec && values > static_cast<double>(file_bytes) / sizeof(double))
    throw_invalid_file(d.file_path(), in_quotes(d.name()) + " claims more values than the file holds");
  return d.type_class() == H5T_INTEGER ? crc_of(d.read_all<std::int64_t>()) : crc_of(d.read_all<double>());
}

}  // namespace

std::uint32_t crc32(std::span<const unsigned char> bytes, std::uint32_t crc) {
  crc = ~crc;
  for (const unsigned char b : bytes) crc = kTable[(crc ^ b) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

nlohmann::json table_checksums(const File& file) {
  nlohmann::json sums = nlohmann::json::object();
  for (const char* group : {"metrics", "tensors", "eval"}) {
    if (!file.has_link(group)) continue;
    for (const std::string& name : file.child_names(group)) {
      if (std::string(group) == "tensors" && name == "names") continue;
      const std::string path = std::string(group) + "/" + name;
      sums[path] = table_crc(file.open_dataset(path));
    }
  }
  return sums;
}

void verify_table_checksums(const File& file) {
  if (!file.has_attribute("checksums")) return;
  const std::string text = file.read_string_attribute("checksums");
  if (text.empty()) return;
  const nlohmann::json stored = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!stored.is_object()) throw_invalid_file(file.file_path(), "the 'checksums' attribute is not a JSON object");
  for (const auto& [path, sum] : stored.items()) {
    if (!sum.is_number_unsigned())
      throw_invalid_file(file.file_path(), "the 'checksums' attribute holds no CRC-32 for " + in_quotes(path));
    if (!file.has_link(path))
      throw_invalid_file(file.file_path(), "checksum mismatch: " + in_quotes(path) + " is missing");
    const std::uint32_t now = table_crc(file.open_dataset(path));
    if (now != sum.get<std::uint32_t>())
      throw_invalid_file(file.file_path(), "checksum mismatch in " + in_quotes(path) +
                                               ": its values differ from those written when the file was closed");
  }
}

}  // namespace scape::run_file
