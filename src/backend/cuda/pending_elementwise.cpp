// TEMPORARY (being written in this change): replaced by elementwise.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  MT_CHECK(false, "cuda copy: not implemented yet");
}

void CudaBackend::fill(Tensor& dst, double value) {
  MT_CHECK(false, "cuda fill: not implemented yet");
}

void CudaBackend::copy_rounded(const Tensor& src, Tensor& dst, const RoundingOptions& rounding) {
  MT_CHECK(false, "cuda copy_rounded: not implemented yet");
}

void CudaBackend::uniform(Tensor& dst, double a, double b, uint64_t seed, uint64_t offset) {
  MT_CHECK(false, "cuda uniform: not implemented yet");
}

void CudaBackend::normal(Tensor& dst, double mean, double stddev, uint64_t seed, uint64_t offset) {
  MT_CHECK(false, "cuda normal: not implemented yet");
}

void CudaBackend::round_to_format(Tensor& t, Format format) {
  MT_CHECK(false, "cuda round_to_format: not implemented yet");
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& out, Scalars s) {
  MT_CHECK(false, "cuda unary: not implemented yet");
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y,
                                 Tensor& gx, Scalars s) {
  MT_CHECK(false, "cuda unary_backward: not implemented yet");
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  MT_CHECK(false, "cuda binary: not implemented yet");
}

void CudaBackend::add_scaled(const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  MT_CHECK(false, "cuda add_scaled: not implemented yet");
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  MT_CHECK(false, "cuda where: not implemented yet");
}

void CudaBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& out,
                          Tensor& mask) {
  MT_CHECK(false, "cuda dropout: not implemented yet");
}

}  // namespace mantissa::backend::cuda
