// Why conv_transpose2d runs on conv2d's backward-data kernel (docs/tensor.md): oneDNN's
// deconvolution_forward against convolution_backward_data for the DC-GAN generator's transposed
// convolutions (k4 s2 p1, batch 64), fp32 and bf16, layouts chosen by oneDNN (format any),
// execution only (no reorders), median of 30 runs after 5 warm-up runs; prints both times and
// the implementations oneDNN picked. oneDNN alone: no Mantissa code runs.
//   OMP_NUM_THREADS=1 build/bench/bench_deconv
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <dnnl.hpp>
#include <unordered_map>
#include <vector>
using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

namespace {

double median_ms(stream& s, primitive& p, std::unordered_map<int, memory>& args) {
  for (int i = 0; i < 5; ++i)
    p.execute(s, args);
  s.wait();
  std::vector<double> t;
  for (int i = 0; i < 30; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    p.execute(s, args);
    s.wait();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  struct Shape {
    long N, Cin, H, Cout;
  };
  for (Shape sh : {Shape{64, 128, 7, 64}, Shape{64, 64, 14, 1}}) {
    for (dt d : {dt::f32, dt::bf16}) {
      const long OH = sh.H * 2;
      memory::dims src = {sh.N, sh.Cin, sh.H, sh.H}, dst = {sh.N, sh.Cout, OH, OH};
      memory::dims strides = {2, 2}, pad = {1, 1}, dil = {0, 0};
      // deconvolution: src = x (C_in), dst = y (C_out), weights (C_out, C_in, k, k)
      auto dsrc = memory::desc(src, d, tag::any), ddst = memory::desc(dst, d, tag::any);
      deconvolution_forward::desc dd(prop_kind::forward_training, algorithm::deconvolution_direct,
                                     dsrc, memory::desc({sh.Cout, sh.Cin, 4, 4}, d, tag::any), ddst,
                                     strides, dil, pad, pad);
      deconvolution_forward::primitive_desc dpd(dd, eng);
      std::unordered_map<int, memory> da{{DNNL_ARG_SRC, memory(dpd.src_desc(), eng)},
                                         {DNNL_ARG_WEIGHTS, memory(dpd.weights_desc(), eng)},
                                         {DNNL_ARG_DST, memory(dpd.dst_desc(), eng)}};
      deconvolution_forward dp(dpd);
      const double t_deconv = median_ms(s, dp, da);
      // convolution backward-data: diff_dst = x (C_in channels = conv's O), diff_src = y
      convolution_forward::desc fd(prop_kind::forward_training, algorithm::convolution_direct,
                                   memory::desc(dst, d, tag::any),
                                   memory::desc({sh.Cin, sh.Cout, 4, 4}, d, tag::any),
                                   memory::desc(src, d, tag::any), strides, dil, pad, pad);
      convolution_forward::primitive_desc fpd(fd, eng);
      convolution_backward_data::desc bd(algorithm::convolution_direct,
                                         memory::desc(dst, d, tag::any),
                                         memory::desc({sh.Cin, sh.Cout, 4, 4}, d, tag::any),
                                         memory::desc(src, d, tag::any), strides, dil, pad, pad);
      convolution_backward_data::primitive_desc bpd(bd, eng, fpd);
      std::unordered_map<int, memory> ba{{DNNL_ARG_DIFF_DST, memory(bpd.diff_dst_desc(), eng)},
                                         {DNNL_ARG_WEIGHTS, memory(bpd.weights_desc(), eng)},
                                         {DNNL_ARG_DIFF_SRC, memory(bpd.diff_src_desc(), eng)}};
      convolution_backward_data bp(bpd);
      const double t_bwd = median_ms(s, bp, ba);
      std::printf(
          "x (%ld,%ld,%ld,%ld) -> y (%ld,%ld,%ld,%ld) %s: deconvolution %.3f ms (%s), "
          "backward-data %.3f ms (%s)\n",
          sh.N, sh.Cin, sh.H, sh.H, sh.N, sh.Cout, OH, OH, d == dt::f32 ? "f32" : "bf16", t_deconv,
          dpd.impl_info_str(), t_bwd, bpd.impl_info_str());
    }
  }
}
