// The tasks (task.h): which one trains a model, their defaults, and what each honours.
#include "train/task.h"

#include <fmt/format.h>

#include "mantissa/core/error.h"
#include "mantissa/nn/models.h"
#include "train/tasks/gan.h"
#include "train/tasks/recommender.h"
#include "train/tasks/supervised.h"

namespace mantissa::train {
namespace {

// _(Enumerator, the Task class): each class has kName, kFeatures, kInput (the data it reads)
// and defaults(TrainConfig&).
#define MT_FORALL_TASKS(_)                    \
  _(ImageClassification, ImageClassifierTask) \
  _(LanguageModel, LanguageModelTask)         \
  _(Gan, GanTask)                             \
  _(Recommender, RecommenderTask)

enum class TaskKind : uint8_t {
#define MT_TASK_ENUMERATOR(e, cls) e,
  MT_FORALL_TASKS(MT_TASK_ENUMERATOR)
#undef MT_TASK_ENUMERATOR
};

struct TaskRow {
  std::string_view name;
  config::Features features;
  config::DataInput input;
  void (*defaults)(TrainConfig&);
  std::unique_ptr<Task> (*make)();
};

constexpr TaskRow kTasks[] = {
#define MT_TASK_ROW(e, cls)                                 \
  {cls::kName, cls::kFeatures, cls::kInput, &cls::defaults, \
   [] { return std::unique_ptr<Task>(std::make_unique<cls>()); }},
    MT_FORALL_TASKS(MT_TASK_ROW)
#undef MT_TASK_ROW
};

// The models `mantissa train` trains: the registry's (but the GAN's halves) and dcgan.
std::vector<std::string> model_list() {
  std::vector<std::string> names;
  for (const std::string& n : nn::model_names()) {
    if (std::find(GanTask::kParts.begin(), GanTask::kParts.end(), n) == GanTask::kParts.end())
      names.push_back(n);
  }
  names.push_back(std::string(GanTask::kModel));
  return names;
}

TaskKind task_kind(const std::string& model) {
  if (model == GanTask::kModel) return TaskKind::Gan;
  const std::vector<std::string> names = model_list();
  if (std::find(names.begin(), names.end(), model) == names.end()) {
    std::vector<std::string_view> views(names.begin(), names.end());
    MT_CHECK(
        std::find(GanTask::kParts.begin(), GanTask::kParts.end(), model) == GanTask::kParts.end(),
        "model '", model, "' is half of the DC-GAN; train the pair with --model dcgan");
    const std::string near = nearest_name(model, views);
    MT_CHECK(false, "unknown model '", model, "'",
             near.empty() ? std::string() : "; did you mean '" + near + "'?",
             "; the models: ", fmt::format("{}", fmt::join(names, ", ")));
  }
  switch (nn::model_input(model)) {
    case nn::ModelInput::Image:
      return TaskKind::ImageClassification;
    case nn::ModelInput::Tokens:
      return TaskKind::LanguageModel;
    case nn::ModelInput::Clicks:
      return TaskKind::Recommender;
    case nn::ModelInput::Latent:
      break;
  }
  MT_ASSERT(false, "no task for model ", model);
}

const TaskRow& task_of(const std::string& model) {
  return kTasks[size_t(task_kind(model))];
}

// "images (--data fashion-mnist or synthetic)" for a task's input.
std::string data_for(config::DataInput input) {
  std::vector<std::string_view> names;
  for (config::DataKind d : all_words<config::DataKind>())
    if (config::data_input(d) == input) names.push_back(name_of(d));
  constexpr const char* kInputs[] = {"images", "tokens", "click logs"};
  return fmt::format("{} (--data {})", kInputs[size_t(input)], fmt::join(names, " or "));
}

}  // namespace

TrainConfig defaults_for(const std::string& model) {
  TrainConfig c;
  c.model = model;
  task_of(model).defaults(c);
  return c;
}

std::string task_name(const std::string& model) {
  return std::string(task_of(model).name);
}

std::vector<std::pair<std::string, std::string>> trainable_models() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& m : model_list())
    out.emplace_back(m, task_name(m));
  return out;
}

void check_supported(const TrainConfig& c) {
  const TaskRow& task = task_of(c.model);
  MT_CHECK(config::data_input(c.data) == task.input, "model '", c.model, "' (", task.name,
           ") trains on ", data_for(task.input), ", not --data ", name_of(c.data));
  // fp8 and fp4 run Linear layers' GEMMs by their recipes; each one's options shape its
  // precision's recipe alone.
  struct GemmPrecision {
    amp::Precision precision;
    config::Feature feature;
    bool taken = false;
  };
  GemmPrecision gemms[] = {{amp::Precision::FP8, config::Feature::Fp8},
                           {amp::Precision::FP4, config::Feature::Fp4}};
  config::Features have = task.features | config::data_features(c.data);
  for (GemmPrecision& g : gemms) {
    const std::string name(name_of(g.precision));
    MT_CHECK(c.precision != g.precision || task.features[size_t(g.feature)], "--precision ", name,
             " runs Linear layers' GEMMs in ", name, "; the ", task.name, " (model ", c.model,
             ") does not take it: use fp32, tf32, bf16, bf16-pure or fp16");
    g.taken = have[size_t(g.feature)];
    if (c.precision != g.precision) have.reset(size_t(g.feature));
  }
  config::Features of_data;
  for (config::DataKind d : all_words<config::DataKind>())
    of_data |= config::data_features(d);
  // The task's defaults (the recommender's --synthetic-size) are not given values.
  const TrainConfig defaults = defaults_for(c.model);
  for (const config::OptionInfo& o : config::options()) {
    const auto need = size_t(o.feature);
    if (o.feature == config::Feature::Any || have[need] || config::same_value(c, defaults, o.field))
      continue;
    const std::string opt = "--" + std::string(o.key);
    const std::string given = opt + " " + config::value_text(c, o.field);
    for (const GemmPrecision& g : gemms) {
      MT_CHECK(o.feature != g.feature || !g.taken, "the --", name_of(g.precision),
               "-* options apply to --precision ", name_of(g.precision), ", not ",
               name_of(c.precision), " (", given, ")");
    }
    MT_CHECK(of_data[need], given, ": the ", task.name, " (model ", c.model,
             ") does not take it (it applies to ", help_of(o.feature), "); drop ", opt);
    MT_CHECK(false, given, " applies to ", help_of(o.feature), ", not --data ", name_of(c.data),
             "; drop ", opt);
  }
}

std::unique_ptr<Task> make_task(const TrainConfig& config) {
  return task_of(config.model).make();
}

}  // namespace mantissa::train
