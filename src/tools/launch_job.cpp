#include "tools/launch_job.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/launch_output.h"

namespace dpt {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// `name` as execvp would find it: a path as it is, else the first
// executable file of that name in PATH; "" if there is none.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string file = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(file.c_str(), X_OK) == 0) return file;
  }
  return "";
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::vector<char*> argv_of(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

int status_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

int precheck(const std::vector<std::string>& cmd, int world) {
  if (cmd.size() < 2 || cmd[1] != "train") return 0;
  const std::string exe = find_program(cmd[0]);
  // Another dpt binary might not know the variable and would train: only
  // this one is run.
  if (exe.empty() || !same_file(exe, "/proc/self/exe")) return 0;
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) throw IoError(fmt::format("cannot make a pipe: {}", std::strerror(errno)));
  std::vector<char*> argv = argv_of(cmd);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw IoError(fmt::format("cannot start {}: {}", exe, std::strerror(errno)));
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(err[1], 2);
    ::setenv(kPrecheckWorld, std::to_string(world).c_str(), 1);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(err[1]);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) != 0;)
    if (n > 0) said.append(buf, static_cast<size_t>(n));
    else if (errno != EINTR) break;
  ::close(err[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (said.empty()) said = fmt::format("dpt: error: the check of the command before launch failed (status {})\n",
                                       status_code(status));
  std::fputs(said.c_str(), stderr);
  return status_code(status);
}

namespace {

volatile std::sig_atomic_t g_job = 0, g_stop = 0;

// A signal to the launcher (a scheduler's SIGTERM, Ctrl-C) goes to the job;
// mpirun has its own process group, so the terminal's reaches it once.
void forward_signal(int sig) {
  g_stop = sig;
  if (g_job > 0) ::kill(static_cast<pid_t>(g_job), sig);
}

}  // namespace

void supervise_jobs() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);  // no SA_RESTART: poll returns at once
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  // A reader of dpt launch's output that has gone must not end it while
  // the job runs: the output is dropped instead.
  std::signal(SIGPIPE, SIG_IGN);
}

int stop_signal() { return g_stop; }

namespace {

// This process's descendants that have not exited. dpt launch is their
// subreaper, so a dead mpirun's children are still among them.
std::vector<pid_t> descendants() {
  std::map<pid_t, std::vector<pid_t>> children;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
    if (paren == std::string::npos) continue;
    std::istringstream rest(text.substr(paren + 1));
    char state = 0;
    pid_t ppid = 0;
    if ((rest >> state >> ppid) && state != 'Z') children[ppid].push_back(std::stoi(name));
  }
  std::vector<pid_t> out{::getpid()};
  for (size_t i = 0; i < out.size(); ++i)
    for (pid_t c : children[out[i]]) out.push_back(c);
  out.erase(out.begin());
  return out;
}

// One mpirun: its output through LaunchOutput, its end.
class Job {
 public:
  Job(const std::vector<std::string>& args, bool verbose) : args_(args), verbose_(verbose) {}
  int run();

 private:
  void start();
  bool pump(int timeout_ms);
  void take(int i, const char* data, size_t n);
  void flush_stale();
  void show(const std::vector<std::string>& lines);
  void reap();
  void end_all();

  std::vector<std::string> args_;
  bool verbose_;
  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};  // mpirun's stdout, stderr
  std::string partial_;     // stderr's last line, until its newline comes
  Clock::time_point partial_since_;
  bool raw_ = false;        // stderr passed on as it is up to its next newline
  std::optional<LaunchOutput> output_;
  std::optional<int> status_;
};

void Job::start() {
  if (find_program(args_[0]).empty())
    throw InputError(fmt::format("cannot run {}: not found in PATH (install openmpi-bin)", args_[0]));
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw IoError(fmt::format("cannot make a pipe: {}", std::strerror(errno)));
  std::vector<char*> argv = argv_of(args_);
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw IoError(fmt::format("cannot start {}: {}", args_[0], std::strerror(errno)));
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    std::signal(SIGPIPE, SIG_DFL);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "dpt: error: cannot run %s: %s (install openmpi-bin)\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: whichever runs first
  ::close(out[1]);
  ::close(err[1]);
  fds_[0] = out[0];
  fds_[1] = err[0];
  g_job = pid_;
  output_.emplace(verbose_, static_cast<long>(pid_));
}

void write_all(int fd, const char* data, size_t size) {
  for (size_t at = 0; at < size;) {
    const ssize_t n = ::write(fd, data + at, size - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed reader: the rest is dropped
    at += static_cast<size_t>(n);
  }
}

void Job::show(const std::vector<std::string>& lines) {
  for (const std::string& l : lines) write_all(2, (l + "\n").data(), l.size() + 1);
}

// stdout goes on as it comes (rank 0's progress bar redraws its line
// without a newline); stderr by lines, through LaunchOutput.
void Job::take(int i, const char* data, size_t n) {
  if (i == 0) return write_all(1, data, n);
  if (raw_) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', n));
    const size_t upto = nl ? static_cast<size_t>(nl - data) + 1 : n;
    write_all(2, data, upto);
    raw_ = nl == nullptr;
    data += upto;
    n -= upto;
  }
  if (partial_.empty() && n > 0) partial_since_ = Clock::now();
  partial_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
    show(output_->line(partial_.substr(start, nl - start)));
  partial_.erase(0, start);
  if (start > 0 && !partial_.empty()) partial_since_ = Clock::now();
}

// A piece of a stderr line whose newline has not come for a while (a
// prompt, a rank stuck mid-line) is shown as it is, and so is the rest of
// its line: such a line is nobody's error sentence or banner.
void Job::flush_stale() {
  if (partial_.empty() || seconds_since(partial_since_) < 0.5) return;
  write_all(2, partial_.data(), partial_.size());
  partial_.clear();
  raw_ = true;
}

// Reads what mpirun has written, waiting up to timeout_ms for it. False
// once both pipes are closed.
bool Job::pump(int timeout_ms) {
  pollfd p[2];
  int n = 0;
  for (int i = 0; i < 2; ++i)
    if (fds_[i] >= 0) p[n++] = {fds_[i], POLLIN, 0};
  if (n == 0) return false;
  if (::poll(p, static_cast<nfds_t>(n), timeout_ms) <= 0) return true;
  char buf[1 << 16];
  for (int k = 0; k < n; ++k) {
    if (!p[k].revents) continue;
    const int i = p[k].fd == fds_[0] ? 0 : 1;
    const ssize_t got = ::read(fds_[i], buf, sizeof buf);
    if (got > 0) {
      take(i, buf, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      ::close(fds_[i]);
      fds_[i] = -1;
      if (i == 1 && !partial_.empty()) take(i, "\n", 1);  // a last line without its newline
    }
  }
  return true;
}

// Collects exited children: mpirun's status, and orphans handed to this
// process as their subreaper.
void Job::reap() {
  int status = 0;
  for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;)
    if (p == pid_) {
      status_ = status_code(status);
      g_job = 0;
    }
}

// SIGTERM to mpirun and everything it started on this host, SIGKILL to
// what is left kTermGraceS later. Output keeps flowing meanwhile, so no
// process blocks on a full pipe.
void Job::end_all() {
  for (pid_t p : descendants()) ::kill(p, SIGTERM);
  const auto t0 = Clock::now();
  while (seconds_since(t0) < kTermGraceS && !descendants().empty()) {
    pump(50);
    reap();
  }
  for (pid_t p : descendants()) ::kill(p, SIGKILL);
  if (!status_) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = status_code(status);
    g_job = 0;
  }
  reap();
}

int Job::run() {
  start();
  std::optional<Clock::time_point> failed_at;
  bool ended = false;
  while (!status_) {
    pump(100);
    flush_stale();
    reap();
    if (!failed_at && !output_->failure().empty()) failed_at = Clock::now();
    if (!status_ && failed_at && seconds_since(*failed_at) > kEndWaitS) {
      ended = true;
      end_all();
    }
  }
  // A failed job's leftovers (ranks mpirun could not end, a remote
  // host's agent) are ended too; a job that succeeded is left as it is.
  if (!ended && *status_ != 0 && !descendants().empty()) end_all();
  // Whatever still holds the pipes open is not waited for long.
  for (const auto t0 = Clock::now(); seconds_since(t0) < 2.0 && pump(100);) {
  }
  if (!partial_.empty()) take(1, "\n", 1);
  show(output_->finish());
  if (!ended && *status_ != 0 && output_->failure_unnamed() && !verbose_)
    std::fprintf(stderr, "dpt launch: a rank exited with status %d; mpirun did not say which (--verbose shows its text)\n",
                 *status_);
  if (!ended) return *status_;
  std::fprintf(stderr,
               "dpt launch: mpirun had not ended the job %.0f s after its first failure (%s): ended mpirun and what "
               "it started on this host\n",
               kEndWaitS, output_->failure().c_str());
  return 1;
}

}  // namespace

int run_job(const std::vector<std::string>& args, bool verbose) { return Job(args, verbose).run(); }

}  // namespace dpt
