// Reading a run file back checks its layout first, the check RunRecorder::open_for_resume makes too.
#include "run_file/run_summary.hpp"

#include <cstdint>
#include <string>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"

namespace scape::run_file {

void check_run_file(const File& file) {
  for (const char* attr : {"layout_version", "config"})
    if (!file.has_attribute(attr))
      throw_invalid_file(file.file_path(), std::string("not a scape run file (no '") + attr + "' attribute)");
  const std::int64_t version = file.read_int_attribute("layout_version");
  if (version != kRunLayoutVersion)
    throw_invalid_file(file.file_path(), "unsupported run-file layout_version " + std::to_string(version) +
                                             " (this build reads " + std::to_string(kRunLayoutVersion) + ")");
}

RunFileSummary read_run_summary(const std::filesystem::path& path) {
  const auto lock = lock_hdf5();
  const File file = File::open(path, Access::read);
  check_run_file(file);
  RunFileSummary summary;
  summary.config_json = file.read_string_attribute("config");
  summary.status = file.read_string_attribute("status");
  summary.error = file.read_string_attribute("error");
  summary.steps_completed = static_cast<long>(file.read_int_attribute("steps_completed"));
  return summary;
}

}  // namespace scape::run_file
