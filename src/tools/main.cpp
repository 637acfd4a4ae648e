// The `dpt` command: train and evaluate models.
//
// Every error the user can cause ends here as one sentence on stderr and a
// non-zero exit: 1 for bad input, files or a failed peer, 2 for a bug in the
// engine. Under a launcher the sentence names the rank, and a failing rank
// leaves with _exit: finalising MPI beside a dead or waiting peer can hang,
// and the launcher ends the job on the first non-zero exit.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include <CLI/CLI.hpp>

#include "comm/process_group.h"
#include "core/error.h"
#include "tools/commands.h"
#include "tools/integer_flags.h"

namespace {

std::string who() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::string("dpt[rank ") + r + "]";
  return "dpt";
}

int fail(int code, const char* kind, const char* what) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s%s\n", who().c_str(), kind, what);
  std::fflush(stderr);
  if (dpt::comm::launched_by_mpi()) ::_exit(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dpt: data-parallel training engine"};
  app.require_subcommand(1);
  dpt::TrainCommand train(app);
  dpt::EvalCommand eval(app);
  dpt::GenerateCommand generate(app);
  dpt::TokensCommand tokens(app);
  dpt::LaunchCommand launch(app);
  dpt::PlanCommand plan(app);
  dpt::BenchCommCommand bench_comm(app);
  dpt::BenchDataCommand bench_data(app);
  dpt::check_integer_flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ConversionError& e) {
    const std::string range = dpt::integer_flag_error(app, e);
    return fail(1, "error: ", range.empty() ? e.what() : range.c_str());
  } catch (const CLI::ParseError& e) {
    // A flag error is a user error like any other: one sentence, exit 1
    // (CLI11's own codes, 105 and up, mean nothing to a user or a script).
    return fail(1, "error: ", e.what());
  }
  try {
    if (train.chosen()) return train.run();
    if (eval.chosen()) return eval.run();
    if (generate.chosen()) return generate.run();
    if (tokens.chosen()) return tokens.run();
    if (launch.chosen()) return launch.run();
    if (plan.chosen()) return plan.run();
    if (bench_comm.chosen()) return bench_comm.run();
    if (bench_data.chosen()) return bench_data.run();
  } catch (const dpt::InternalError& e) {
    return fail(2, "", e.what());
  } catch (const dpt::Error& e) {
    return fail(1, "error: ", e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "error: ", "out of memory");
  } catch (const std::exception& e) {
    return fail(2, "internal error: ", e.what());
  }
  return 0;
}
