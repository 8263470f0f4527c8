// SIGTERM and SIGINT as a request to stop a run at its next step boundary (docs/run-files.md,
// "Signals"): the handler only records the signal; rank 0's run log reads it after each step's
// row, checkpoints where checkpoints are on, marks the file `interrupted` and closes it; the
// command exits 128 + the signal. A second signal ends the process at once, as if unhandled.
#pragma once

namespace scape::train {

// Installs the handlers for SIGTERM and SIGINT (`scape run`, every backend).
void install_stop_handlers();
// The first stop signal this process received since the handlers were installed, or 0.
int stop_signal();

// What rank 0's run log acts on: a signal, and the MPI rank it reached (-1: this process).
struct StopRequest {
  int signal = 0;
  int rank = -1;
};
// The request a multi-process exchange noted from the ranks' reports, else this process's signal.
StopRequest stop_request();
// A multi-process exchange, on rank 0: `signal` reached `rank` (kept: the first one noted).
void note_stop_signal(int signal, int rank);
// "SIGTERM", "SIGINT", else "a signal".
const char* signal_name(int signal);

}  // namespace scape::train
