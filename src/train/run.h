// Internal: the state of one training run, shared by the Trainer's loop and its task.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "mantissa/autograd/anomaly.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/optim/schedule.h"
#include "mantissa/train/trainer.h"
#include "train/run_log.h"
#include "train/task.h"
#include "train/trainee.h"

namespace mantissa::train {

struct Run {
  TrainConfig config;
  Device device;
  TrainState state;
  std::unique_ptr<Task> task;
  // The networks being trained; the first is the main model.
  std::vector<std::unique_ptr<Trainee>> trainees;
  std::shared_ptr<const data::Dataset> train_data;
  std::unique_ptr<data::DevicePrefetcher> loader;
  std::unique_ptr<optim::LRSchedule> schedule;
  bool loader_started = false;  // by next_batch()
  int64_t dataset_bytes = 0;
  std::shared_ptr<dist::Communicator> comm;       // config.distributed: MPI or NCCL
  std::shared_ptr<dist::Communicator> host_comm;  // config.distributed: MPI
  std::unique_ptr<RunLog> log;                    // --metrics and --tensorboard (rank 0)
  bool config_recorded = false;                   // the log's "config" record is written
  const std::atomic<int>* stop_flag = nullptr;
  bool quiet = false;
  std::vector<float> step_losses;
  UnderflowStats underflow;
  // --detect-anomaly: the models' module paths and parameter names, for the report.
  autograd::AnomalyNames anomaly_names;
  // The newest checkpoint of a healthy state (written by this run or resumed from) and its step:
  // where --on-divergence rollback returns to.
  std::string last_good_checkpoint;
  int64_t last_good_step = 0;

  // What the loop asks of the step under way.
  struct StepRequest {
    bool histograms = false;   // TensorBoard histograms of gradients and weights
    bool record_norm = false;  // the gradient norm, for the train record
  } request;

  int rank() const { return comm ? comm->rank() : 0; }
  int world_size() const { return comm ? comm->world_size() : 1; }
  Trainee& main() { return *trainees.front(); }
  const Trainee& main() const { return *trainees.front(); }
  // A network of the task: the optimizer, precision and data-parallel wrapper of the
  // configuration around `model` (fp32, built by the task; moved to the run's device here).
  Trainee& add_trainee(std::string name, std::shared_ptr<nn::Module> model,
                       std::vector<optim::ParamGroup> groups);
  // Whether the stop flag is up, the same answer on every rank (0: go on; else the signal).
  int stop_requested() const;
  // The stop flag as a data loader or an evaluation polls it (this rank's alone, no collective).
  bool stopping() const { return stop_flag && stop_flag->load(std::memory_order_relaxed) != 0; }
  // The schedule's learning rate of this step (times the rollbacks' factor) on every optimizer.
  void apply_schedule();
  // The schedule's learning rate of this step, for an update outside the optimizers.
  double lr() const { return schedule->lr_at(state.step) * state.lr_scale; }
  // Every trainee's parameters' histograms (TensorBoard), gradients or weights.
  void write_weight_histograms(int64_t step);
};

// ZeRO-3: every trainee's parameters whole while the result lives, for what reads them outside
// a training step (an evaluation then runs without a collective a block); empty otherwise.
// Every rank makes it at the same point.
std::vector<std::unique_ptr<dist::DistributedDataParallel::FullParameters>> whole_models(
    const Run& run);

// What one optimizer step takes, in flags: "--batch-size 64 x --grad-accum 4 x 2 ranks".
std::string step_text(const Run& run);
// Training needs a step's examples (every rank's) to fit in the data: a larger batch is not one
// full batch, nor several passes over the data a step. (An evaluation builds the same run on any
// data.)
void check_step_fits_the_data(const Run& run);
// A checkpoint of the run's state (data parallel: every rank calls it, rank 0 writes).
void save_run(const Run& run, const std::string& path);
// The state of a checkpoint: the models' weights and fp8 scales; with `everything`, the
// optimizers, scalers, the task's state and the run's position too.
void restore_run(Run& run, const Checkpoint& ckpt, bool everything);
// The records of records.cpp: the per-layer fp8 amaxes and scales, and the summary's numbers.
Json fp8_record(const Run& run);
std::string summary_of(const Run& run, const TrainResult& result);

}  // namespace mantissa::train
