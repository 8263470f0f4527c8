// A run file's summary read back (status, steps completed, config), as scape sweep and scape repair check it.
#pragma once

#include <filesystem>
#include <string>

namespace scape::run_file {

class File;

struct RunFileSummary {
  std::string status, error, config_json;
  long steps_completed = 0;
};

// Throws H5Error naming the file for a missing file, a non-HDF5 file, or an HDF5 file that is
// not a run file (no config / layout_version attribute, or an unknown layout_version).
RunFileSummary read_run_summary(const std::filesystem::path& path);

// The check of read_run_summary, also made by RunRecorder::open_for_resume: throws H5Error naming
// the file unless it has the config and layout_version attributes of a layout this build reads.
void check_run_file(const File& file);

}  // namespace scape::run_file
