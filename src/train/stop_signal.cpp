#include "train/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace dpt {

namespace {

volatile std::sig_atomic_t g_received = 0;
struct sigaction g_old_term, g_old_int;

void on_signal(int sig) {
  if (g_received != 0) _exit(128 + sig);  // the second: no more waiting
  g_received = sig;
  const char msg[] = "dpt: signal received; stopping after this step (send it again to stop at once)\n";
  (void)!::write(2, msg, sizeof msg - 1);  // async-signal-safe, unlike printf
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write the signal lands in carries on
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
}

int StopSignals::received() { return g_received; }

}  // namespace dpt
