// The `dpt` command: train and evaluate models.
//
// Every error the user can cause ends here as one sentence on stderr and a
// non-zero exit: 1 for bad input or files, 2 for a bug in the engine.
#include <cstdio>
#include <new>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"dpt: data-parallel training engine"};
  app.require_subcommand(1);
  dpt::TrainCommand train(app);
  dpt::EvalCommand eval(app);
  dpt::LaunchCommand launch(app);
  dpt::BenchCommCommand bench_comm(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train.chosen()) return train.run();
    if (eval.chosen()) return eval.run();
    if (launch.chosen()) return launch.run();
    if (bench_comm.chosen()) return bench_comm.run();
  } catch (const dpt::InternalError& e) {
    std::fprintf(stderr, "dpt: %s\n", e.what());
    return 2;
  } catch (const dpt::Error& e) {
    std::fprintf(stderr, "dpt: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dpt: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpt: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
