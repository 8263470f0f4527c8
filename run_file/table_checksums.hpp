// Checksums of a run file's per-step tables (docs/run-files.md, "Checksums"): the root attribute
// `checksums`, JSON {"metrics/train_loss": CRC-32, ...}, written when the recorder closes the
// file and by `scape repair`, empty while a writer has it open. A value changed afterwards (a
// flipped bit on the disk, an edit) no longer matches; `scape repair` and the analysis check it.
#pragma once

#include <cstdint>
#include <span>

#include <nlohmann/json.hpp>

namespace scape::run_file {

class File;

// CRC-32 of `bytes` (IEEE 802.3, the polynomial of zlib's crc32 and Python's zlib.crc32),
// continuing from `crc` (0 to start).
std::uint32_t crc32(std::span<const unsigned char> bytes, std::uint32_t crc = 0);

// Every table of /metrics, /tensors (but names) and /eval: its CRC-32 over its values as
// little-endian float64 (int64 for integer tables), row-major.
nlohmann::json table_checksums(const File& file);

// Compares the root attribute `checksums` (when present and not empty) with the tables; throws
// H5Error naming the file and the first table that differs, or one the attribute names that is
// missing.
void verify_table_checksums(const File& file);

}  // namespace scape::run_file
