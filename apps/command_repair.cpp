// scape repair: a killed run's file made to open plainly.
#include <cstdio>

#include "apps/cli_common.hpp"
#include "run_file/hdf5_handle.hpp"
#include "run_file/recorder.hpp"
#include "run_file/run_lock.hpp"

namespace scape::cli {
namespace {

int cmd_repair(const std::vector<std::string>& files) {
  int code = kExitOk;
  for (const auto& file : files) {
    try {
      // One writer: a live run's file is refused, naming its writer.
      const auto lock = run_file::RunFileLock::for_writing(file);
      if (lock.taken_over()) std::fprintf(stderr, "%s\n", lock.taken_over_note().c_str());
      const auto r = run_file::repair_run_file(file);
      std::printf("%s: %s; status %s%s; %ld steps kept", file.c_str(),
                  r.was_open_for_writing ? "cleared the flags of a writer that never closed" : "was closed cleanly",
                  r.status_after.c_str(),
                  r.status_after != r.status_before ? (" (was " + r.status_before + ")").c_str() : "",
                  r.steps_completed);
      if (r.steps_completed < r.steps_completed_before)
        std::printf("; steps_completed lowered from %ld: a table held fewer rows (a kill in mid-flush)",
                    r.steps_completed_before);
      if (!r.trimmed.empty())
        std::printf("; dropped the rows of an interrupted flush from %zu tables", r.trimmed.size());
      std::printf("\n");
    } catch (const run_file::RunFileBusy& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      code = kExitInvalid;
    } catch (const run_file::H5Error& e) {
      // Not a run file, or one that cannot be read back: invalid input, left as it was.
      std::fprintf(stderr, "error: %s; the file is left unchanged\n", e.what());
      code = kExitInvalid;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      code = kExitFailure;
    }
  }
  return code;
}

}  // namespace

Command add_repair_command(CLI::App& app) {
  const auto files = std::make_shared<std::vector<std::string>>();
  auto* repair = app.add_subcommand(
      "repair",
      "make killed runs' files open plainly (h5py.File(p, 'r'), h5dump): clear the 'open for writing' "
      "flags their writer left, drop rows of an interrupted flush, read every table back, mark status "
      "killed. A run still writing its file is refused (exit 2); a file that is not a run file or "
      "cannot be read back is left unchanged (exit 2)");
  repair->add_option("run_files", *files, "run files (RUN.h5)")->required()->check(CLI::ExistingFile);
  Command c;
  c.sub = repair;
  c.run = [files] { return cmd_repair(*files); };
  return c;
}

}  // namespace scape::cli
