// SIGTERM and SIGINT as a request to stop a run at its next step boundary (docs/run-files.md,
// "Signals"): the handler only records the signal; rank 0's run log reads it after each step's
// row, checkpoints where checkpoints are on, marks the file `interrupted` and closes it; the
// command exits 128 + the signal. A second signal ends the process at once, as if unhandled.
#pragma once

namespace scape::train {

// Installs the handlers for SIGTERM and SIGINT (the process's own: `scape run` in the simulator).
void install_stop_handlers();
// The first stop signal received since the handlers were installed, or 0.
int stop_signal();
// "SIGTERM", "SIGINT", else "a signal".
const char* signal_name(int signal);

}  // namespace scape::train
