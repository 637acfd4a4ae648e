// What `dpt launch` shows of a job's stderr (docs/launch.md, "Output").
//
// mpirun's stderr carries every rank's stderr and mpirun's own text (its
// stdout, the ranks' stdout, is passed on byte for byte: rank 0's progress
// bar is drawn on the pseudo-terminal Open MPI gives it). The launcher
// passes lines through as they come, but
//  - a line `dpt[rank N]: TEXT` that another rank already printed with the
//    same TEXT is left out: a failure every rank reports alike shows once;
//  - mpirun's boilerplate on a failed job (its dashed "Primary job
//    terminated normally..." and "mpirun detected that one or more
//    processes exited..." banners, "abort is already in progress", the
//    crash trace of mpirun itself) is left out; what it says that no rank
//    said (which rank exited, with what status or signal) becomes one line;
//  - any other banner of mpirun's (it could not start the job, a warning)
//    is shown as it is.
// With `verbose` every line is shown as it came. Either way it notes the
// job's first failure, after which mpirun should end the job.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace dpt {

class LaunchOutput {
 public:
  // mpirun_pid: mpirun's own lines start "[host:pid]".
  LaunchOutput(bool verbose, long mpirun_pid);

  // One complete line of mpirun's stderr, without its newline: the lines
  // to print now.
  std::vector<std::string> line(const std::string& text);
  // At the end of the output: a banner mpirun left open, as it is.
  std::vector<std::string> finish();

  // The job's first failure in one sentence (a rank's error line, or which
  // rank mpirun saw exit); empty while there is none.
  const std::string& failure() const { return failure_; }
  // Whether a failure was seen but nothing shown names the rank: mpirun
  // sometimes prints its "Primary job terminated normally..." banner and
  // not the next one, which names the rank and its status.
  bool failure_unnamed() const;

 private:
  void banner_done(std::vector<std::string>& out);
  void rank_line(int rank, const std::string& text, const std::string& line, std::vector<std::string>& out);
  bool from_mpirun(const std::string& text) const;
  void failed(const std::string& what, int level);

  bool verbose_;
  long mpirun_pid_;
  bool in_banner_ = false;
  std::vector<std::string> banner_;   // its lines, dashes included
  std::map<std::string, std::set<int>> said_;  // a rank line's text -> the ranks that said it
  std::string failure_;
  int level_ = 0;                     // how sure failure_ is (launch_output.cpp)
  bool dropped_ = false;              // the last line was mpirun's, left out
};

}  // namespace dpt
