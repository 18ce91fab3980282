"""Mantissa from Python: mixed-precision training with exact rounding.

    import mantissa as mt
    model = mt.make_model("mlp", seed=1)
    opt = mt.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = mt.GradScaler()
    with mt.autocast("cpu", dtype="bf16"):
        loss = mt.cross_entropy(model(x), y)
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

Tensors share memory with NumPy and PyTorch (DLPack: `mt.from_dlpack(a)`, `np.from_dlpack(t)`,
`torch.from_dlpack(t)`); bf16, fp16 and fp8 arrays are ml_dtypes' NumPy dtypes. See
docs/python.md.
"""
import numpy as _np

try:
    from . import _mantissa
except ImportError as _e:  # the source tree's python/mantissa without the built extension
    raise ImportError(
        "the Mantissa extension module (_mantissa) is not built beside "
        f"{__file__}: install the package (`pip install .` in the repository, or scripts/setup) "
        "and import it from outside the source tree's python/ directory") from _e
from ._mantissa import (AdamW, Error, GradScaler, Module, Optimizer, SGD, Tensor, Trainer,
                        argmax, autocast, cross_entropy, eq, from_dlpack, gelu, linear,
                        make_model, manual_seed, matmul, mean, model_names, no_grad, normal,
                        ones, relu, set_num_threads, softmax, sum, zeros)

__version__ = _mantissa.__version__
Linear = _mantissa.Linear

try:
    import ml_dtypes as _ml
    # Mantissa's half and fp8 dtypes as NumPy sees them.
    _NUMPY_OF = {"bf16": _ml.bfloat16, "f16": _np.float16, "fp8_e4m3": _ml.float8_e4m3fn,
                 "fp8_e5m2": _ml.float8_e5m2}
    # The storage formats of convert() (the C++ storage types), as NumPy sees them.
    _STORAGE = {"bf16": _ml.bfloat16, "fp16": _np.float16, "fp8_e4m3": _ml.float8_e4m3fn,
                "fp8_e5m2": _ml.float8_e5m2, "fp6_e2m3": _ml.float6_e2m3fn,
                "fp6_e3m2": _ml.float6_e3m2fn, "fp4_e2m1": _ml.float4_e2m1fn,
                "e8m0": _ml.float8_e8m0fnu}
except ImportError:  # ml_dtypes is a dependency; without it only bf16/fp8 arrays are refused
    _ml = None
    _NUMPY_OF = {"f16": _np.float16}
    _STORAGE = {"fp16": _np.float16}

_DTYPE_OF = {_np.dtype(v).name: k for k, v in _NUMPY_OF.items()}


def _numpy(self):
    """A NumPy array sharing this CPU tensor's memory (bf16/fp8: ml_dtypes' dtypes)."""
    raw = self._numpy_view()
    if self.dtype in _NUMPY_OF:
        return raw.view(_NUMPY_OF[self.dtype])
    if self.dtype in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        raise Error(f"a {self.dtype} tensor needs ml_dtypes to become a NumPy array")
    return raw


def _array(self, dtype=None, copy=None):
    a = _numpy(self)
    if copy:
        a = a.copy()
    return a if dtype is None else a.astype(dtype)


Tensor.numpy = _numpy
Tensor.__array__ = _array


def tensor(data, dtype=None):
    """A new tensor holding a copy of `data` (anything NumPy reads), optionally cast to `dtype`."""
    a = _np.array(data, copy=True)
    if a.dtype == _np.float64 and dtype is None:
        a = a.astype(_np.float32)  # as torch.tensor: Python floats become f32
    t = from_numpy(_np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


def from_numpy(a):
    """A tensor sharing a NumPy array's memory (no copy); ml_dtypes' bfloat16/float8 included."""
    a = _np.asarray(a)
    name = _DTYPE_OF.get(a.dtype.name)
    if name is not None and name != "f16":
        # NumPy's DLPack export refuses ml_dtypes' types: share the same bytes as unsigned ints.
        return _mantissa._from_dlpack_as(a.view(_np.uint8 if a.itemsize == 1 else _np.uint16), name)
    return from_dlpack(a)


def round(x, format, rounding="nearest", overflow="inf", seed=0, out=None):
    """`x`'s values moved onto `format`'s grid, as float32 (the emulation primitive).

    format: fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1 or e8m0;
    rounding: nearest (ties to even), truncate or stochastic (draws are a function of seed and
    position); overflow: inf or saturate. Bit-identical to the C++ round_in_place, vectorized, without the GIL. out: a
    C-contiguous float32 array to write (x itself rounds in place, without a copy).
    """
    if out is None:
        out = _np.array(x, dtype=_np.float32, copy=True, order="C")
    elif out is not x:
        _np.copyto(out, x, casting="same_kind")
    _mantissa._round_in_place(out.reshape(-1), format, rounding, overflow, seed)
    return out


def convert(x, format, rounding="nearest", saturate=False, seed=0):
    """`x` (as float32) stored in `format`: an ml_dtypes array of bf16, fp16 (NumPy's float16),
    fp8_e4m3 (float8_e4m3fn), fp8_e5m2, fp6_e2m3 (float6_e2m3fn), fp6_e3m2 (float6_e3m2fn),
    fp4_e2m1 (float4_e2m1fn) or e8m0 (float8_e8m0fnu). saturate=True clamps finite overflow to the
    largest finite value (fp8 recipes do); otherwise overflow is inf (NaN for e4m3 and e8m0,
    which have no inf; the largest value for fp6 and fp4, which have neither)."""
    if format not in _STORAGE:
        raise Error(f"convert: unknown storage format '{format}'; use "
                    f"{', '.join(_STORAGE)}" + ("" if _ml else " (the others need ml_dtypes)"))
    src = _np.ascontiguousarray(x, dtype=_np.float32)
    out = _np.empty(src.shape, dtype=_STORAGE[format])
    raw = out.view(_np.uint8 if out.itemsize == 1 else _np.uint16)
    _mantissa._convert(src.reshape(-1), raw.reshape(-1), format, rounding, saturate, seed)
    return out


def inspect(x, rounding="nearest", saturate=False):
    """What each format stores for the number `x` (a float or text such as "0.1" or "0x1p-3"):
    {format: {bits, hex, sign, exponent, mantissa, value, abs_error, rel_error, class, overflow,
    underflow}}, as `mantissa formats` prints it."""
    text = x if isinstance(x, str) else repr(float(x))
    return _mantissa._inspect(text, rounding, saturate)


__all__ = [
    "AdamW", "Error", "GradScaler", "Linear", "Module", "Optimizer", "SGD", "Tensor", "Trainer",
    "argmax", "autocast", "convert", "cross_entropy", "eq", "from_dlpack", "from_numpy", "gelu",
    "inspect", "linear", "make_model", "manual_seed", "matmul", "mean", "model_names", "no_grad",
    "normal", "ones", "relu", "round", "set_num_threads", "softmax", "sum", "tensor", "zeros", "__version__",
]
