// `dpt launch`: mpirun with the defaults a dptrain job wants (docs/launch.md
// says why each one is there), run by tools/launch_job.h.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "core/error.h"
#include "train/checkpoint.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/launch_job.h"

extern char** environ;

namespace dpt {

namespace {

constexpr const char* kMpirun = "mpirun";
// Oversubscribing tests correctness (4 ranks on 2 cores, 64 ranks' dry run on
// one); more than 64 ranks per slot is past any use, and on the way to forking
// a machine to a halt.
constexpr int kMaxRanksPerSlot = 64;

int logical_cpus() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// Physical cores, which is what Open MPI counts as slots on a host: with SMT
// two hardware threads share one core, and `mpirun -n <logical cpus>` would
// refuse to start without --oversubscribe.
int physical_cores() {
  namespace fs = std::filesystem;
  std::set<std::pair<std::string, std::string>> cores;  // (package, core id)
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 4 || name.compare(0, 3, "cpu") != 0 ||
        !std::all_of(name.begin() + 3, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::ifstream core(e.path() / "topology/core_id"), pkg(e.path() / "topology/physical_package_id");
    std::string c, p;
    if (core >> c && pkg >> p) cores.emplace(p, c);
  }
  int n = static_cast<int>(cores.size());
  return n > 0 ? std::min(n, logical_cpus()) : logical_cpus();
}

struct Host {
  std::string name;
  int slots = 0;
};

// An Open MPI hostfile: "name [slots=N] [max_slots=N]" per line, '#'
// comments. A host without slots= gets as many as it has cores (Open MPI's
// rule); remote hosts are assumed to have as many as this one.
std::vector<Host> read_hostfile(const std::string& path, int default_slots) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open hostfile: {}", path, std::strerror(errno)));
  std::vector<Host> hosts;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    // "slots=4" alone on a line is a host name to mpirun, which then fails
    // with a boxed parse error.
    if (h.name.find('=') != std::string::npos)
      throw InputError(fmt::format("{}:{}: '{}' is not a host name: a line starts with the host", path, lineno, h.name));
    h.slots = default_slots;
    for (std::string w; words >> w;) {
      if (w.rfind("slots=", 0) != 0) continue;  // max_slots= and others: mpirun's business
      const std::string v = w.substr(6);
      char* end = nullptr;
      long s = v.empty() ? 0 : std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || s < 1 || s > 1 << 20)
        throw InputError(fmt::format("{}:{}: bad slot count '{}'", path, lineno, w));
      h.slots = static_cast<int>(s);
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) throw InputError(fmt::format("{}: the hostfile names no host", path));
  return hosts;
}

// The ranks mpirun puts on each host when it fills hosts slot by slot (its
// default mapping); past the total slots, the rest go round-robin.
std::vector<int> place_ranks(const std::vector<Host>& hosts, int ranks) {
  std::vector<int> placed(hosts.size(), 0);
  int left = ranks;
  for (size_t i = 0; i < hosts.size() && left > 0; ++i) {
    placed[i] = std::min(left, hosts[i].slots);
    left -= placed[i];
  }
  for (size_t i = 0; left > 0; i = (i + 1) % hosts.size(), --left) ++placed[i];
  return placed;
}

// The command's program as mpirun will exec it: a path, or a name on PATH.
// Refused here in one sentence: mpirun's own answer is a boxed paragraph
// and a status of 132 or 134, as if a rank had crashed.
void check_program(const std::string& program) {
  namespace fs = std::filesystem;
  const auto runnable = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (!runnable(program))
      throw InputError(fmt::format("{}: {}", program,
                                   fs::exists(program) ? "not an executable file" : "no such program"));
    return;
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (runnable(fs::path(dir.empty() ? "." : dir) / program)) return;
  throw InputError(fmt::format("{}: no such program on PATH", program));
}

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./=:,+@%", c);
  });
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The value of `flag` in a command ("--flag v" or "--flag=v"), or "".
std::string flag_value(const std::vector<std::string>& cmd, const std::string& flag) {
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == flag && i + 1 < cmd.size()) return cmd[i + 1];
    if (cmd[i].rfind(flag + "=", 0) == 0) return cmd[i].substr(flag.size() + 1);
  }
  return "";
}

}  // namespace

LaunchCommand::LaunchCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("launch", "run a command as N ranks under mpirun (docs/launch.md)");
  cmd_->add_option("-n,--np", ranks_, "number of ranks")->required();
  cmd_->add_option("--hostfile", hostfile_, "Open MPI hostfile (default: all ranks on this host)");
  cmd_->add_option("--bind", bind_, "none (default): ranks float over all cores; core: pin each rank to one")
      ->check(CLI::IsMember({"none", "core"}));
  cmd_->add_flag("--dry-run", dry_run_, "check a dpt train command, then print the mpirun command instead of running it");
  cmd_->add_flag("--verbose", verbose_,
                 "show every line as it came: each rank's, where ranks said the same, and mpirun's own");
  cmd_->add_option("--max-restarts", max_restarts_,
                   "when the job fails, run it again from the latest checkpoint of its --checkpoint-dir, at most this "
                   "many times")
      ->check(non_negative());
  cmd_->add_option("command", command_, "the command each rank runs, after --");
  cmd_->footer("Example: dpt launch -n 2 -- build/dpt train --model mlp");
}

std::vector<std::string> LaunchCommand::mpirun_args() const {
  if (ranks_ < 1) throw InputError(fmt::format("-n must be at least 1 (got {})", ranks_));
  if (command_.empty())
    throw InputError(
        "no command to launch: give it after --, as in: dpt launch -n 2 -- build/dpt train --model mlp");
  check_program(command_.front());

  const int cores = physical_cores();
  const std::vector<Host> hosts =
      hostfile_.empty() ? std::vector<Host>{{"localhost", cores}} : read_hostfile(hostfile_, cores);
  const std::vector<int> placed = place_ranks(hosts, ranks_);
  int slots = 0;
  for (const Host& h : hosts) slots += h.slots;
  const int per_host = *std::max_element(placed.begin(), placed.end());
  // A typo such as -n 1000 for -n 10 would have mpirun fork that many
  // processes onto one host, and it does not stop at SIGTERM while it forks.
  for (size_t i = 0; i < hosts.size(); ++i)
    if (placed[i] > kMaxRanksPerSlot * hosts[i].slots)
      throw InputError(fmt::format("-n {} puts {} ranks on {} of {} slot{}, more than {} per slot (each rank is a "
                                   "process with its own memory and threads); give fewer ranks, or hosts in a "
                                   "--hostfile",
                                   ranks_, placed[i], hostfile_.empty() ? "this host" : "host " + hosts[i].name,
                                   hosts[i].slots, hosts[i].slots == 1 ? "" : "s", kMaxRanksPerSlot));
  std::vector<std::string> args{kMpirun, "-n", std::to_string(ranks_)};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  if (ranks_ > slots) args.push_back("--oversubscribe");
  // When a rank dies, let the survivors report their error (each names the
  // collective that failed) before the job ends: without this, mpirun kills
  // them within a second of the first exit. The job still exits non-zero.
  args.insert(args.end(), {"--mca", "orte_allowed_exit_without_sync", "1"});
  if (!hostfile_.empty()) args.insert(args.end(), {"--hostfile", hostfile_});
  if (bind_ == "core")
    args.insert(args.end(), {"--bind-to", "core", "--map-by", "core"});
  else
    args.insert(args.end(), {"--bind-to", "none"});

  // Share the cores of a host between its ranks, unless the user chose.
  if (std::getenv("OMP_NUM_THREADS"))
    args.insert(args.end(), {"-x", "OMP_NUM_THREADS"});
  else
    args.insert(args.end(),
                {"-x", fmt::format("OMP_NUM_THREADS={}", std::max(1, logical_cpus() / per_host))});
  // OpenMP's idle workers spin, so ranks whose thread teams share cores
  // spin against each other (W-GPT, 2 ranks x 2 threads on 2 cores: 313 ms
  // a step, 115 with sleeping workers). Unless the user chose a policy,
  // teams that oversubscribe the host's cores sleep while they wait.
  const std::string flag = flag_value(command_, "--threads");
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int threads = !flag.empty() ? std::atoi(flag.c_str())
                      : omp         ? std::atoi(omp)
                                    : std::max(1, logical_cpus() / per_host);
  if (std::getenv("OMP_WAIT_POLICY"))
    args.insert(args.end(), {"-x", "OMP_WAIT_POLICY"});
  else if (per_host * std::max(1, threads) > logical_cpus())
    args.insert(args.end(), {"-x", "OMP_WAIT_POLICY=PASSIVE"});
  // The engine's settings (DPT_COMM_*, ...) reach every rank, remote ones too.
  std::vector<std::string> dpt_vars;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("DPT_", 0) == 0 && kv.find('=') != std::string::npos)
      dpt_vars.push_back(kv.substr(0, kv.find('=')));
  }
  std::sort(dpt_vars.begin(), dpt_vars.end());
  for (const auto& v : dpt_vars) args.insert(args.end(), {"-x", v});

  args.insert(args.end(), command_.begin(), command_.end());
  return args;
}

namespace {

// The command with "--resume dir" in place of any --resume it had.
std::vector<std::string> with_resume(const std::vector<std::string>& cmd, const std::string& dir) {
  std::vector<std::string> out;
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == "--resume") {
      ++i;
      continue;
    }
    if (cmd[i].rfind("--resume=", 0) == 0) continue;
    out.push_back(cmd[i]);
  }
  out.insert(out.end(), {"--resume", dir});
  return out;
}

}  // namespace

// torchrun's elastic restart, for a fixed world: the job runs again from its
// latest complete checkpoint (from the start if it has none yet) until it
// succeeds, is stopped by a signal, or has failed max_restarts + 1 times.
int LaunchCommand::run_with_restarts(const std::vector<std::string>& args) const {
  const std::string dir = flag_value(command_, "--checkpoint-dir");
  if (dir.empty())
    throw InputError("--max-restarts restarts from checkpoints: give the command a --checkpoint-dir");
  supervise_jobs();
  const size_t command_at = args.size() - command_.size();
  std::vector<std::string> run = args;
  for (int attempt = 0;; ++attempt) {
    const int status = run_job(run, verbose_);
    if (status == 0 || stop_signal()) return status;
    if (attempt == max_restarts_) {
      std::fprintf(stderr, "dpt launch: the job failed (exit status %d) and has used its %d restart%s\n", status,
                   max_restarts_, max_restarts_ == 1 ? "" : "s");
      return status;
    }
    std::string from = "its start (no complete checkpoint yet)";
    run = args;
    try {
      const std::string latest = find_checkpoint(dir);
      std::vector<std::string> cmd = with_resume(command_, dir);
      run.resize(command_at);
      run.insert(run.end(), cmd.begin(), cmd.end());
      from = latest;
    } catch (const InputError&) {
    }
    std::fprintf(stderr, "dpt launch: the job failed (exit status %d); restart %d of %d from %s\n", status,
                 attempt + 1, max_restarts_, from.c_str());
  }
}

int LaunchCommand::run() {
  // Set by the precheck for its own child only; a rank that saw it would
  // check and stop instead of training.
  ::unsetenv(kPrecheckWorld);
  // mpirun refuses to run inside its own job with a banner from every rank.
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE"))
    throw InputError(fmt::format("dpt launch runs here as a rank of an mpirun job of {} ranks, and mpirun does not "
                                 "run inside its own jobs: give the command to one dpt launch",
                                 size));
  const auto args = mpirun_args();
  // A `dpt train` command that would fail alike on every rank (its flags,
  // its mesh for -n ranks) is refused here, once, before any rank starts;
  // --dry-run checks too, so that it answers whether the job would start.
  if (const int refused = precheck(command_, ranks_)) return refused;
  if (dry_run_) {
    std::string line;
    for (const auto& a : args) line += (line.empty() ? "" : " ") + shell_quote(a);
    std::printf("%s\n", line.c_str());
    return 0;
  }
  if (max_restarts_ > 0) return run_with_restarts(args);
  supervise_jobs();
  return run_job(args, verbose_);
}

}  // namespace dpt
