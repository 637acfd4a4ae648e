// How `dpt launch` runs a job (docs/launch.md): it checks a `dpt train`
// command before starting any rank, then runs mpirun as a child, shows its
// output through LaunchOutput, and makes sure the job ends once it has
// failed, even where mpirun cannot end it (a host cut off).
#pragma once

#include <string>
#include <vector>

namespace dpt {

// Under this variable `dpt train` parses its flags as usual, runs
// check_launch for a world of its value, and exits: 1 with its sentence,
// or 0 (tools/train_command.cpp). dpt launch removes it from the job's
// environment.
inline constexpr const char* kPrecheckWorld = "DPT_PRECHECK_WORLD";

// After a job's first failure (tools/launch_output.h) mpirun normally ends
// every rank within a second or two (1.1 s on one host, 2.0 s across two
// in tests/dist/two_hosts_cli.cpp). kEndWaitS later it is taken to be stuck
// (waiting for a daemon on a host it cannot reach): dpt launch then sends
// SIGTERM to it and to every process it started on this host, and SIGKILL
// to those left kTermGraceS after that.
inline constexpr double kEndWaitS = 5.0;
inline constexpr double kTermGraceS = 2.0;

// When `cmd` runs this binary's `train` (its argv[0], looked up in PATH,
// is the file of /proc/self/exe), runs it once with kPrecheckWorld=world,
// no MPI, its stdout discarded. Returns 0 when it passed or was not run;
// otherwise its exit status, its sentence printed on stderr as it gave it.
int precheck(const std::vector<std::string>& cmd, int world);

// Makes dpt launch the subreaper of what it starts (the orphans of a
// killed mpirun stay its descendants, to be ended) and passes SIGINT,
// SIGTERM and SIGHUP on to the running job. Call once, before run_job.
void supervise_jobs();
// The signal dpt launch was sent, or 0.
int stop_signal();

// Runs `args` (mpirun and its arguments) to its end. Returns mpirun's exit
// status (128 + signal if it was killed), or 1 when dpt launch had to end
// the job (kEndWaitS): then its last line on stderr names the job's first
// failure. `verbose`: every line as it came (LaunchOutput).
int run_job(const std::vector<std::string>& args, bool verbose);

}  // namespace dpt
