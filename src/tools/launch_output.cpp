#include "tools/launch_output.h"

#include <regex>

#include <fmt/format.h>

namespace dpt {

namespace {

// Open MPI frames its messages (show_help) in lines of dashes: 74 from
// mpirun, 60 in some of its components' messages.
bool dashes(const std::string& s) { return s.size() >= 40 && s.find_first_not_of('-') == std::string::npos; }

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// How sure a failure's sentence is of what happened: a rank's own error
// line beats mpirun's report of an exit, which beats its boilerplate.
enum Level { kNone, kGeneric, kMpirun, kRank };

}  // namespace

LaunchOutput::LaunchOutput(bool verbose, long mpirun_pid)
    : verbose_(verbose), mpirun_pid_(mpirun_pid) {}

// The deadline starts at the first failure (failure_ set); a surer
// sentence arriving later only replaces the words.
void LaunchOutput::failed(const std::string& what, int level) {
  if (level <= level_) return;
  level_ = level;
  failure_ = what;
}

bool LaunchOutput::failure_unnamed() const { return level_ == kGeneric; }

// mpirun's own lines outside banners: "mpirun: abort is already in
// progress...", and what mpirun itself logs as "[host:pid] ..." (PMIx
// errors, the trace of its own crash). A rank's "[host:pid]" lines carry
// the rank's pid and are kept.
bool LaunchOutput::from_mpirun(const std::string& text) const {
  if (text.rfind("mpirun: abort is already in progress", 0) == 0) return true;
  if (text.empty() || text[0] != '[') return false;
  // The pid may be zero-padded: "[host:00995]".
  static const std::regex tag(R"(^\[[^\]:]*:0*(\d{1,9})\])");
  std::smatch m;
  return std::regex_search(text, m, tag) && std::stol(m[1].str()) == mpirun_pid_;
}

void LaunchOutput::rank_line(int rank, const std::string& text, const std::string& line,
                             std::vector<std::string>& out) {
  if (text.rfind("error: ", 0) == 0 || text.rfind("internal error: ", 0) == 0) failed(line, kRank);
  std::set<int>& ranks = said_[text];
  // The same sentence from another rank: the same failure (or notice),
  // already shown. A rank repeating itself is shown again.
  const bool shown_by_another = !ranks.empty() && !ranks.count(rank);
  ranks.insert(rank);
  if (verbose_ || !shown_by_another) out.push_back(line);
}

std::vector<std::string> LaunchOutput::line(const std::string& text) {
  std::vector<std::string> out;
  const bool was_dropped = dropped_;
  dropped_ = false;
  if (in_banner_ || dashes(text)) {
    banner_.push_back(text);
    // A banner is its opening dashes, its text and its closing dashes.
    if (in_banner_ && dashes(text)) banner_done(out);
    else in_banner_ = true;
    return out;
  }
  static const std::regex rank_prefix(R"(^dpt\[rank (\d{1,9})\]: (.*)$)");
  std::smatch m;
  if (std::regex_match(text, m, rank_prefix)) {
    rank_line(std::stoi(m[1].str()), m[2].str(), text, out);
  } else if (from_mpirun(text) || (was_dropped && text.empty())) {
    dropped_ = true;  // and the blank line mpirun prints after its abort notice
    if (verbose_) out.push_back(text);
  } else {
    out.push_back(text);
  }
  return out;
}

// A whole banner: mpirun's notice of a failed job is boiled down to what it
// says about the ranks; anything else is shown.
void LaunchOutput::banner_done(std::vector<std::string>& out) {
  in_banner_ = false;
  std::string all;
  for (const std::string& l : banner_) all += l + "\n";
  const std::vector<std::string> lines = std::move(banner_);
  banner_.clear();
  if (verbose_)
    for (const std::string& l : lines) out.push_back(l);
  static const std::regex noticed(R"(mpirun noticed that process rank \d+ [^\n]*)");
  static const std::regex detected(R"(Process name: \[\[\d+,\d+\],(\d+)\][\s\S]*Exit code: *(\d+))");
  std::smatch m;
  if (has(all, "terminated normally, but")) {
    failed("a rank exited with a non-zero status", kGeneric);
  } else if (has(all, "exited with non-zero status") && std::regex_search(all, m, detected)) {
    const std::string what = fmt::format("dpt launch: rank {} exited with status {}", m[1].str(), m[2].str());
    // A rank that said why it failed needs no second sentence.
    if (level_ < kRank && !verbose_) out.push_back(what);
    failed(what, kMpirun);
  } else if (std::regex_search(all, m, noticed)) {
    // A signal: the rank had no chance to say anything, so this line is kept.
    if (!verbose_) out.push_back(m[0].str());
    failed(m[0].str(), kMpirun);
  } else {
    // Shown: mpirun's words are the only account of these.
    if (has(all, "lost communication with a remote daemon")) failed("mpirun lost contact with a host", kMpirun);
    if (has(all, "MPI_ABORT was invoked")) failed("a rank called MPI_Abort", kMpirun);
    if (!verbose_)
      for (const std::string& l : lines) out.push_back(l);
  }
}

std::vector<std::string> LaunchOutput::finish() {
  std::vector<std::string> out;
  for (const std::string& l : banner_) out.push_back(l);
  banner_.clear();
  in_banner_ = false;
  return out;
}

}  // namespace dpt
