// How a rank runs one optimizer step's micro-batches, and what of the model
// it holds. The training loop drives every run through this interface and
// never asks which one it has:
//
//   per step:  strategy.begin_step()
//              executor.run(step, times, timeline)   every micro-batch's
//                  forward and backward; returns the step's mean loss, the
//                  same on every rank of a replica
//              strategy.finish_backward()
//              executor.grad_norm_squared()           the whole model's
//              strategy.scale_grads(), strategy.step()
//              executor.after_step()                  copies kept in step
//   at the end: executor.save(path, options)
//
// SequentialExecutor runs the micro-batches one after another through the
// whole model (every strategy without --pp); PipelineExecutor
// (train/pipeline_executor.h) runs them as one stage of a pipeline.
#pragma once

#include <cstdint>
#include <string>

#include "models/weights.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "train/evaluate.h"

namespace dpt {

class Timeline;
class DataSource;
struct StepBreakdown;
struct TrainOptions;

class Executor {
 public:
  virtual ~Executor() = default;
  // Forward and backward of the step's micro-batches; adds the data,
  // forward and backward times into t and, with tl, their spans.
  virtual double run(int64_t step, StepBreakdown& t, Timeline* tl) = 0;
  // Sum of squares of the whole model's reduced gradient, the same on
  // every rank.
  virtual double grad_norm_squared() = 0;
  virtual void after_step() {}
  // Writes the whole model's weights (collective over every rank).
  virtual void save(const std::string& path, const SaveOptions& options) = 0;
  // Collective over every rank: what save() writes, in memory. The whole
  // model's current parameters in the layout of Decoder(config) (no stage,
  // no slice) into `whole` on rank 0 of the job; the other ranks pass
  // nullptr. Training's samples (train/sample.h) read them.
  virtual void gather_weights(float* whole) = 0;
  // Spans run() adds to a timeline per step at most.
  virtual size_t trace_spans() const = 0;
  // Bytes of activations this rank holds at most (every arena).
  virtual size_t activation_bytes() const = 0;
  // Collective: one evaluation batch's forward when the model's own
  // forward is not the whole model's (a pipeline stage); null: it is.
  virtual const ForwardFn* eval_forward() { return nullptr; }
  // Collective: what the summary reports of the run's layout (null: nothing).
  virtual nlohmann::json detail() { return nullptr; }
};

class SequentialExecutor : public Executor {
 public:
  // loss_scale: the strategy's, over the micro-batches. With tensor
  // parallelism, tp is the mesh's TP group (model: its slice of a GPT).
  SequentialExecutor(const TrainOptions& o, comm::ProcessGroup& pg, Model& model, Strategy& strategy,
                     DataSource& data, float loss_scale, const Mesh& mesh, comm::ProcessGroup* tp = nullptr)
      : o_(o), pg_(pg), model_(model), strategy_(strategy), data_(data), loss_scale_(loss_scale), mesh_(mesh),
        tp_(tp) {}
  double run(int64_t step, StepBreakdown& t, Timeline* tl) override;
  // Under TP, each rank's share summed over the TP group (models/model.h's
  // grad_squares counts the replicated tensors once in that sum).
  double grad_norm_squared() override;
  void save(const std::string& path, const SaveOptions& options) override;
  void gather_weights(float* whole) override;
  size_t trace_spans() const override;
  size_t activation_bytes() const override { return model_.activation_bytes(); }

 private:
  const TrainOptions& o_;
  comm::ProcessGroup& pg_;
  Model& model_;
  Strategy& strategy_;
  DataSource& data_;
  Batch batch_;
  float loss_scale_;
  Mesh mesh_;
  comm::ProcessGroup* tp_;
  std::vector<double> norm_parts_;
};

// Writes the weights a unit at a time: every rank takes part in each unit's
// gather, the lead streams it into the file.
void save_model(Strategy& strategy, const Model& model, const std::string& path, const SaveOptions& options,
                bool lead);

}  // namespace dpt
