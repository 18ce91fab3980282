// Internal: one LSTM step's pointwise math, element (b, j) of a (B, H) state, written once for
// both backends (the CPU's loops and the CUDA kernel call these same expressions, as op_math.h's
// ops). The gates arrive before their activations in torch's order i, f, g, o. M is the math
// policy of op_math.h (exp, tanh).
#pragma once

#include "backend/op_math.h"

namespace mantissa::backend::lstm_math {

template <typename C>
struct Acts {
  C i, f, g, o;
};

// acts = (sigmoid(zi), sigmoid(zf), tanh(zg), sigmoid(zo)); c = f c_prev + i g (i g without a
// previous state); h = o tanh(c).
template <typename M, typename C>
MT_HOST_DEVICE void forward(C zi, C zf, C zg, C zo, C c_prev, bool has_prev, Acts<C>& a, C& c,
                            C& h) {
  a.i = op_math::sigmoid<M>(zi);
  a.f = op_math::sigmoid<M>(zf);
  a.g = M::tanh(zg);
  a.o = op_math::sigmoid<M>(zo);
  c = has_prev ? a.f * c_prev + a.i * a.g : a.i * a.g;
  h = a.o * M::tanh(c);
}

// From dh and dc (the gradients reaching this step's h and c) to the gates' gradients before
// their activations and dc_prev. tanh(c) is recomputed (cheaper to keep than to store).
template <typename M, typename C>
MT_HOST_DEVICE void backward(const Acts<C>& a, C c, C c_prev, bool has_prev, C dh, C dc,
                             Acts<C>& dz, C& dc_prev) {
  const C tc = M::tanh(c);
  const C dct = dc + dh * a.o * (C(1) - tc * tc);
  dz.i = dct * a.g * (a.i * (C(1) - a.i));
  dz.f = has_prev ? dct * c_prev * (a.f * (C(1) - a.f)) : C(0);
  dz.g = dct * a.i * (C(1) - a.g * a.g);
  dz.o = dh * tc * (a.o * (C(1) - a.o));
  dc_prev = dct * a.f;
}

}  // namespace mantissa::backend::lstm_math
