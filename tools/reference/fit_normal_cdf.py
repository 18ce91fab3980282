#!/usr/bin/env python3
"""Fits the polynomial of cpu/vec_math.h's normal_cdf (the standard normal CDF that GELU uses).

For a = |x| / sqrt(2) and t = 1 / (1 + a / 2) (t in (0, 1]), the lower tail is

    Phi(-|x|) = erfc(a) / 2 = t R(t) e^(-x^2 / 2) / 2,   R(t) = erfcx(a) / t,

with erfcx(a) = e^(a^2) erfc(a). R is smooth on [0, 1] (R(1) = 1, R(0) = 1 / (2 sqrt(pi))), so a
polynomial of degree 8 fits it to a few parts in 1e8 (in t = 1 / (1 + |x| / 2) it takes degree
10 for as much). The tail then costs one exp (shared with the derivative's e^(-x^2 / 2)) and one
division, where erf-based forms need an exp of their own polynomial and cancel to nothing in
1 + erf(x / sqrt(2)) below x = -3.

Fit: weighted least squares in relative error on Chebyshev nodes, reweighted (Lawson) towards
minimax, over t in [0.16, 1] (|x| up to 14.5, past which e^(-x^2 / 2) is 0 in float); the
coefficients are then rounded to float, as the C++ code holds them. Prints them, lowest power
first, and the relative error of the float coefficients evaluated in float (Horner), which is
what tests/backend/vec_math_test.cpp sees.

Needs numpy and mpmath (Debian python3-numpy, python3-mpmath). Deterministic; no arguments.
"""
import sys

try:
    import mpmath as mp
    import numpy as np
except ImportError as e:
    sys.exit(f"fit_normal_cdf.py needs numpy and mpmath ({e}): "
             "'python3 -m pip install numpy mpmath'")

T_LO = 0.16
DEGREE = 8
NODES = 2000

mp.mp.dps = 40


def r_exact(t: float) -> float:
    a = 2 * (1 / mp.mpf(t) - 1)
    return float(mp.erfc(a) * mp.exp(a * a) / mp.mpf(t))


def fit() -> np.ndarray:
    k = np.arange(NODES)
    t = 0.5 * (1 + T_LO) + 0.5 * (1 - T_LO) * np.cos(np.pi * (k + 0.5) / NODES)
    y = np.array([r_exact(v) for v in t])
    v = np.vander(t, DEGREE + 1, increasing=True)
    w = np.full(NODES, 1.0 / NODES)
    for _ in range(60):
        c, *_ = np.linalg.lstsq(v * (w / y)[:, None], w, rcond=None)
        err = (v @ c - y) / y
        w = w * np.sqrt(np.abs(err))
        w /= w.sum()
    print(f"relative error of the fit (double coefficients): {np.max(np.abs(err)):.3g}")
    return c


def horner_f32(c: np.ndarray, t: np.ndarray) -> np.ndarray:
    p = np.full_like(t, c[-1])
    for ci in c[-2::-1]:
        p = p * t + ci  # float32 * float32 + float32: each step rounded, as in C++
    return p


def main() -> None:
    c = fit().astype(np.float32)
    t = np.linspace(T_LO, 1, 4001).astype(np.float32)
    ref = np.array([r_exact(float(v)) for v in t])
    got = horner_f32(c, t).astype(np.float64)
    print(f"relative error, float coefficients in float: {np.max(np.abs(got - ref) / ref):.3g}")
    print("coefficients, t^0 first:")
    for ci in c:
        print(f"  {float(ci):.9g}f")


if __name__ == "__main__":
    main()
