// Preemption and Ctrl-C during training: the first SIGTERM or SIGINT asks
// the run to stop after its current step (it then writes a checkpoint and
// exits with 128 + the signal, as a shell reports a signalled process); a
// second one ends the process at once.
#pragma once

namespace dpt {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received so far, or 0.
  static int received();
};

}  // namespace dpt
