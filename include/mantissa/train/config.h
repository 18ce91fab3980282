// What a training run is: everything `mantissa train` takes, as one struct that is also stored
// in every checkpoint (so `--resume` and `mantissa eval` know the model and the data).
#pragma once

#include <cstdint>
#include <string>

namespace mantissa::train {

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct TrainConfig {
  // model and data
  std::string model = "cnn";
  std::string data = "fashion-mnist";  // fashion-mnist | synthetic
  std::string data_dir = kDefaultFashionMnistDir;
  int64_t synthetic_size = 10000;  // examples in the synthetic dataset
  double dropout = 0.0;

  // schedule of the run
  int64_t epochs = 5;
  int64_t max_steps = 0;  // > 0: stop after this many optimizer steps
  int64_t batch_size = 128;
  int64_t eval_batch_size = 256;

  // optimizer
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::string schedule = "cosine";  // constant | step | cosine
  int64_t warmup_steps = 0;
  int64_t step_size = 1000;   // step schedule
  double gamma = 0.1;         // step schedule
  double clip_grad_norm = 0;  // 0: off

  // precision: fp32 | tf32 (f32 GEMM/conv inputs rounded to tf32) | bf16 | fp16 (mixed
  // precision at `opt_level`, amp::initialize) | bf16-pure (bf16 weights without fp32 masters,
  // stochastic rounding; batch norm fp32) | auto (bf16 where the CPU has native bf16 dot
  // products, else fp16; the Trainer stores the choice, so checkpoints name it)
  std::string precision = "fp32";
  // Apex's levels for bf16/fp16: O1 (autocast, fp32 weights; the default), O2 (weights in the
  // half type except batch norm, fp32 masters), O3 (everything half). Empty: the precision's
  // default (O0 for fp32/tf32, O1 for bf16/fp16).
  std::string opt_level;
  std::string loss_scale = "dynamic";  // "dynamic" (fp16 O1/O2) or a fixed number (static)
  // How updates are stored into half weights (O2, O3, bf16-pure): nearest | stochastic. Empty:
  // stochastic for bf16-pure, nearest otherwise.
  std::string rounding;
  // > 0: every this many steps, measure how many non-zero fp32 gradient values underflow to
  // zero in fp16 (bf16/fp16 at O1): cast unscaled, cast at the loss scale, and in the run's own
  // gradients. Costs one extra fp32 forward/backward per measurement.
  int64_t underflow_every = 0;

  // machine
  // Where the model, optimizer state, loss scaler and batches live: cpu | cuda | cuda:N.
  // Checkpoints are written from host copies and load onto any device.
  std::string device = "cpu";
  uint64_t seed = 0;
  int threads = 0;  // 0: every core
  int workers = 2;  // data-loader threads

  // outputs
  std::string metrics_path;     // JSON lines; empty: none
  std::string checkpoint_path;  // written at the end of every epoch; empty: none
  std::string resume_path;      // a checkpoint to continue from
  int64_t log_every = 50;       // steps between train metric records / plain progress lines
  bool progress = true;         // a progress bar on a terminal

  std::string to_json() const;
  static TrainConfig from_json(const std::string& json);  // unknown keys are errors
  // Checks values that would fail later (bad names, non-positive sizes) with a clear message.
  void validate() const;
};

}  // namespace mantissa::train
