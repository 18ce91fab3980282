// The PyTorch AMP recipe in C++: a custom module trained with half weights, fp32 master weights,
// an autocast region and a dynamic loss scaler, on synthetic data. Runs in a second or two.
//
//   ./amp_custom_model        (loss and accuracy every 30 steps; exit status 1 if it did not learn)
#include <cstdio>
#include <memory>
#include <string>

#include <mantissa/mantissa.h>

namespace mt = mantissa;

// Your own model: register the layers, write forward().
class TwoLayerNet : public mt::nn::Module {
 public:
  TwoLayerNet(int64_t in, int64_t hidden, int64_t classes) : Module("TwoLayerNet") {
    fc1_ = register_module("fc1", std::make_shared<mt::nn::Linear>(in, hidden, /*seed=*/1));
    fc2_ = register_module("fc2", std::make_shared<mt::nn::Linear>(hidden, classes, /*seed=*/2));
  }
  mt::Tensor forward(const mt::Tensor& x) override { return (*fc2_)(mt::gelu((*fc1_)(x))); }

 private:
  std::shared_ptr<mt::nn::Linear> fc1_, fc2_;
};

int main() {
  const int64_t n = 256, in = 32, classes = 4;
  // Synthetic task: the label is the argmax of a fixed random projection of x.
  const mt::Tensor x = mt::Tensor::normal({n, in}, 0, 1, /*seed=*/10);
  const mt::Tensor y = mt::argmax(mt::matmul(x, mt::Tensor::normal({in, classes}, 0, 1, 11)), 1);

  auto model = std::make_shared<TwoLayerNet>(in, 64, classes);
  mt::optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  opt.set_master_weights(true);  // fp32 masters, captured while the weights are still fp32...
  model->to(mt::DType::F16);     // ...then the model itself is stored in fp16
  mt::amp::GradScaler scaler;    // dynamic loss scaling: fp16 gradients would underflow

  double first = 0, last = 0;
  for (int step = 0; step <= 150; ++step) {
    opt.zero_grad();
    mt::Tensor loss;
    {
      mt::amp::Autocast autocast(mt::DeviceType::CPU, mt::DType::F16);  // GEMMs in fp16
      loss = mt::cross_entropy((*model)(x), y);                         // the loss in fp32
    }
    scaler.scale(loss).backward();  // gradients of S * loss
    scaler.step(opt);               // unscales; skips the step on inf/NaN gradients
    scaler.update();                // grows or backs off S
    last = loss.item();
    if (step == 0) first = last;
    if (step % 30 == 0) {
      mt::NoGrad no_grad;
      mt::Tensor logits;
      {
        mt::amp::Autocast autocast(mt::DeviceType::CPU, mt::DType::F16);
        logits = (*model)(x);
      }
      const double acc = mt::mean(mt::eq(mt::argmax(logits, 1), y).to(mt::DType::F32)).item();
      std::printf("step %3d  loss %.4f  accuracy %.3f  loss scale %g\n", step, last, acc,
                  scaler.get_scale());
    }
  }
  std::printf("weights %s, master of fc1.weight %s; %lld steps skipped\n",
              std::string(mt::dtype_name(model->parameters()[0].dtype())).c_str(),
              std::string(mt::dtype_name(opt.master(0).dtype())).c_str(),
              static_cast<long long>(scaler.skipped_steps()));
  return last < 0.5 * first ? 0 : 1;
}
