// What a run shows and writes about itself: the header before training, each
// logged step (the progress line and --metrics-out), and at the end every
// rank's medians gathered into the summary (train/report.h prints it and
// makes its JSON).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "parallel/traffic.h"
#include "train/evaluate.h"
#include "train/executor.h"
#include "train/metrics_file.h"
#include "train/progress.h"
#include "train/step.h"
#include "train/train.h"

namespace dpt {

// samples_per_s of a 1-rank run's summary (--baseline).
double read_baseline_throughput(const std::string& path);

// Writes a run's summary JSON `j` (atomically) after adding the fields every
// strategy shares: tokens/s for the GPT, the final evaluation if there was one.
void write_summary(const std::string& path, nlohmann::json j, const TrainResult& r, bool mlp, bool evaluated);

// The run's first lines: model, strategy, ranks, batch and steps; the
// strategy's and the ranks' topology on several ranks; the pipeline.
void print_header(const TrainOptions& o, const Model& model, const Strategy& strategy, const Mesh& mesh,
                  int64_t micro, int64_t steps, bool evaluable, const nlohmann::json& topology);

// One logged step: what the progress line and --metrics-out show.
struct LoggedStep {
  int64_t step;  // 1-based
  double loss, lr, grad_norm;
  StepBreakdown t;
  std::optional<EvalResult> ev;
};
// Checks what is logged (a gradient norm that is not finite means the update
// just applied put NaN or infinity into the parameters), averages the loss
// over the ranks, and shows the step. Returns the global batch's loss.
double log_step_out(comm::ProcessGroup& pg, Progress& progress, MetricsFile* metrics, bool mlp, const LoggedStep& s,
                    double rate);

// Where the ledger stood when training began, to count each step's bytes.
struct LedgerMark {
  explicit LedgerMark(comm::ProcessGroup& pg);
  uint64_t bytes;
  std::map<std::string, comm::OpStats> phases;
};
// The bytes this rank sent per step since `mark`, over the steps [start,
// steps), in total and by phase; and what the plan `planned` makes of those
// steps: the loss averaged on logged steps (every log_every-th and the
// last), the gradient norm on those or, with --clip, on every step, and the
// run's first step.
void count_comm(comm::ProcessGroup& pg, const LedgerMark& mark, const TrainOptions& o, const CommPlan& planned,
                int64_t start, int64_t steps, TrainResult& r);

// A finished run's report: every rank's medians and memory gathered, the
// summary printed (unless quiet) and written (rank 0, --summary-out).
void report_run(const TrainOptions& o, comm::ProcessGroup& pg, const Model& model, const Strategy& strategy,
                Executor& executor, bool evaluated, const StepTimes& times, double baseline, double total_s,
                bool quiet, TrainResult& r);

}  // namespace dpt
