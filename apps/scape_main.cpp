// scape: run, sweep, validate and describe experiments from JSON, and predict cluster step times.
// Exit status: 0 completed, 2 invalid configuration or input, 3 diverged, 1 any other failure.
// Each verb's options and handler live in apps/command_<verb>.cpp (docs/CONTRIBUTING.md, "Add a
// command"); this file parses the command line, starts MPI for a verb that runs under it, and
// dispatches.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "apps/cli_common.hpp"
#include "run_file/hdf5_handle.hpp"

#ifdef SCAPE_HAVE_MPI
#include <mpi.h>
#endif

namespace cli = scape::cli;

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) then fails the write with EFBIG, which the run reports and
  // survives, instead of killing the process half-way through a flush.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"scape: research simulator for communication-sparse distributed training.\n"
               "Exit status: 0 completed, 2 invalid configuration or input, 3 diverged, 1 other failure."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(SCAPE_VERSION) + " (" + scape_git_sha() + ")");
  // The dispatch table, in the order --help lists the verbs.
  const cli::Command commands[] = {cli::add_run_command(app),      cli::add_sweep_command(app),
                                   cli::add_validate_command(app), cli::add_repair_command(app),
                                   cli::add_schema_command(app),   cli::add_predict_command(app),
                                   cli::add_bench_comm_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad option or value is bad input (CLI11's own codes, 105
    // for a failed check and so on, would say nothing the documented statuses do).
    return app.exit(e) == 0 ? cli::kExitOk : cli::kExitInvalid;
  }
  const cli::Command* chosen = nullptr;
  for (const auto& c : commands) {
    if (c.sub->parsed()) chosen = &c;
  }
  if (chosen == nullptr) return cli::kExitOk;
#ifdef SCAPE_HAVE_MPI
  // MPI lives for the whole process: initialised before any run, finalised after.
  struct MpiSession {
    bool active = false;
    ~MpiSession() {
      if (active) MPI_Finalize();
    }
  } mpi_session;
  if (chosen->under_mpi()) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    mpi_session.active = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "error: --backend %s needs MPI_THREAD_MULTIPLE (the lagged all-gather and the watchdog "
                   "run on their own threads)\n", chosen->mpi_backend().c_str());
      return cli::kExitFailure;
    }
  }
#endif
  int code = cli::kExitFailure;
  try {
    code = chosen->run();
  } catch (const scape::config::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = cli::kExitInvalid;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = cli::kExitFailure;
  }
  if (scape::run_file::a_close_failed()) {
    // The failure is reported; HDF5's clean-up at exit could crash on the file it failed to
    // close (a full disk), turning exit 1 into a segmentation fault. End without it.
#ifdef SCAPE_HAVE_MPI
    if (mpi_session.active) {
      MPI_Finalize();
      mpi_session.active = false;
    }
#endif
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}
