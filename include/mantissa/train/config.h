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
  // Image models: fashion-mnist | synthetic. Token models (gpt2_tiny, gpt2, lstm): text (token
  // shards written by `mantissa tokenize`) | synthetic-text (a learnable seeded stream).
  // Recommenders (dcn, train::train_recommender): synthetic-clicks (synthetic_size examples of
  // a log with a planted model, data/clicks.h) | clicks (a TSV/CSV click log at data_path).
  std::string data = "fashion-mnist";
  std::string data_dir = kDefaultFashionMnistDir;
  int64_t synthetic_size = 10000;  // examples (synthetic, synthetic-clicks) or tokens
  // Recommenders: rows of each categorical field's embedding table (tokens are hashed into
  // them, data::hash_token), and how the tables are updated: lazy (AdamW on the rows the batch
  // touched only; the others keep their weights and moments), dense (the optimizer over every
  // row, as any parameter), auto (lazy on the CPU, dense on a GPU).
  int64_t hash_buckets = 10000;
  std::string embedding_update = "auto";
  double dropout = 0.0;

  // language models (data = text | synthetic-text)
  // text: a directory written by `mantissa tokenize --out DIR` (train.bin, val.bin,
  // tokenizer.json) or a training shard; val_path / tokenizer override the directory's files.
  std::string data_path;
  std::string val_path;   // empty: DIR/val.bin, or the last 5% of a lone shard's tokens
  std::string tokenizer;  // empty: DIR/tokenizer.json when it exists (kept for generation)
  int64_t seq_len = 128;  // tokens per training window (<= the model's context)
  // The model's vocabulary: synthetic-text's (0: 256); with text, set from the shard.
  int64_t vocab_size = 0;
  // Evaluation of language models: every this many optimizer steps (0: at each epoch's end), on
  // at most eval_batches batches of non-overlapping windows (0: the whole validation stream).
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  // dcgan: the optimizer steps of the cnn whose features the Fréchet distance compares (0: one
  // epoch of the training images). `mantissa study --quick` trains it 100 steps.
  int64_t fd_feature_steps = 0;

  // batches and memory
  // Micro-batches per optimizer step: each step sees batch_size * grad_accum examples, summed
  // over all micro-batches and divided once by their total target count (the big batch's loss).
  int64_t grad_accum = 1;
  // Recompute each transformer block's / LSTM layer's activations in backward instead of
  // keeping them (less memory, one more forward).
  bool checkpoint_activations = false;

  // schedule of the run
  int64_t epochs = 5;
  int64_t max_steps = 0;  // > 0: stop after this many optimizer steps
  int64_t batch_size = 128;
  // 0: 256 images, or a token model's training batch (its logits are batch x seq_len x vocab).
  int64_t eval_batch_size = 0;

  // optimizer
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  // Which parameters decay: all, or weights (not biases, norm weights and embeddings: the usual
  // split for transformers). auto: weights for token models, all for image models.
  std::string decay = "auto";
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
  // Where a dynamic loss scale starts (PyTorch's init_scale; DeepSpeed's 2^initial_scale_power).
  double init_scale = 65536.0;
  // How updates are stored into half weights (O2, O3, bf16-pure): nearest | stochastic |
  // truncate (toward zero: the BFLOAT16 study's comparison with round-to-nearest). Empty:
  // stochastic for bf16-pure, nearest otherwise.
  std::string rounding;
  // > 0: every this many steps, measure how many non-zero fp32 gradient values underflow to
  // zero in fp16 (bf16/fp16 at O1): cast unscaled, cast at the loss scale, and in the run's own
  // gradients. Costs one extra fp32 forward/backward per measurement.
  int64_t underflow_every = 0;
  // precision fp8 (autocast/fp8.h, docs/fp8.md): the GEMMs of the chosen Linear layers in fp8, the
  // rest as bf16 at opt_level (O1 or O2), a static loss scale of 1 so that steps with inf/NaN
  // gradients are skipped. recipe: delayed | current | mxfp8 | blockwise; format: hybrid (E4M3
  // forward, E5M2 gradients) | e4m3; amax_history and margin: delayed scaling's; layers: inner
  // (the first and last Linear layers stay bf16) | all.
  std::string fp8_recipe = "delayed";
  std::string fp8_format = "hybrid";
  int64_t fp8_amax_history = 1024;
  int fp8_margin = 0;
  std::string fp8_layers = "inner";

  // machine
  // Where the model, optimizer state, loss scaler and batches live: cpu | cuda | cuda:N.
  // Checkpoints are written from host copies and load onto any device.
  std::string device = "cpu";
  uint64_t seed = 0;
  int threads = 0;  // 0: every core
  int workers = 2;  // data-loader threads
  // How gradients are reset before each step: none (dropped, PyTorch's
  // zero_grad(set_to_none=True); the default) | zeros (kept and filled with zeros: their memory
  // stays allocated through the forward pass, and every parameter gets a fill each step).
  std::string zero_grad = "none";
  // How batches reach a GPU (docs/training.md, "Device"): prefetch (the default: the loader's
  // workers pin raw pixels, a side stream copies the next batch while this one trains, the
  // normalization runs on the device) | pinned (batches finished on the host in page-locked
  // memory, copied non_blocking on the compute stream) | pageable (finished on the host in
  // ordinary memory, one blocking copy per batch). On the CPU nothing is copied: the three are
  // the same.
  std::string input_pipeline = "prefetch";
  // Data parallel (`mpirun -n N mantissa train ... --distributed`, docs/distributed.md): every
  // rank trains on its shard of each epoch with batch_size examples a step (N * batch_size in
  // all), gradients averaged over the ranks in buckets of bucket_mb that travel in grad_comm
  // (fp32 | bf16 | fp16) while backward runs; rank 0 alone prints, writes metrics and
  // checkpoints. zero = 1 shards the optimizer state (ZeRO-1): each rank keeps the moments and
  // fp32 masters of its share of the parameters, gradients are reduce-scattered and the updated
  // parameters all-gathered; checkpoints hold the whole state, as without it.
  bool distributed = false;
  double bucket_mb = 25;
  std::string grad_comm = "fp32";
  int zero = 0;

  // outputs
  std::string metrics_path;  // JSON lines; empty: none
  // TensorBoard event files in this directory (empty: none): the scalars of the metrics'
  // train, eval, underflow and fp8 records, the configuration as text, and histograms of the
  // weights and gradients every histogram_every steps (0: at each evaluation).
  std::string tensorboard_dir;
  int64_t histogram_every = 0;
  std::string checkpoint_path;   // written at the end of every epoch; empty: none
  int64_t checkpoint_every = 0;  // > 0: also every this many steps (mid-epoch, resumable)
  std::string resume_path;       // a checkpoint to continue from
  int64_t log_every = 50;        // steps between train metric records / plain progress lines
  // When the run diverges (docs/training.md, "Divergence"): a step applied with a non-finite
  // loss, or divergence_patience steps in a row skipped for inf/NaN gradients where skipping
  // cannot help (fp16's dynamic scale at its minimum, or no dynamic scale). stop: end the run,
  // saying what happened and which checkpoint is the last good one; skip: also check the
  // gradients of fp32/tf32/bf16 steps and skip those with inf/NaN, stopping only after
  // divergence_patience in a row; rollback: reload the last good checkpoint, halve the learning
  // rate and go on (at most 3 times: train::kMaxRollbacks, then stop).
  std::string on_divergence = "stop";
  int64_t divergence_patience = 10;
  // Check every op of each step's forward and backward for inf/NaN and stop at the first one
  // made, naming the op, the module's path, the dtypes, shapes and magnitudes
  // (autograd/anomaly.h). Slow: for finding where an overflow comes from, not for whole runs.
  bool detect_anomaly = false;
  bool progress = true;  // a progress bar on a terminal

  std::string to_json() const;
  static TrainConfig from_json(const std::string& json);  // unknown keys are errors
  // Checks values that would fail later (bad names, non-positive sizes) with a clear message.
  void validate() const;
};

}  // namespace mantissa::train
