#!/usr/bin/env python3
"""Writes tests/data/golden/gan_metrics.json: the reference values that
tests/metrics/image_quality_test.cpp compares Mantissa's Fréchet distance and MS-SSIM with
(src/metrics/image_quality.cpp). The C++ test needs no Python: the inputs are stored in the file.

    python3 tools/reference/make_gan_metrics_golden.py [--out tests/data/golden/gan_metrics.json]

Needs numpy and scipy (pip install numpy scipy). Deterministic for the seeds below.

- frechet: two feature sets (N, D) each; the reference fits them with numpy (mean, np.cov with
  N - 1) and computes |mu1 - mu2|^2 + Tr(S1 + S2 - 2 sqrtm(S1 S2)) with scipy.linalg.sqrtm (the
  real part, as pytorch-fid does). Cases: well-conditioned (N > D) and rank-deficient (N < D).
- sqrtm: a symmetric PSD matrix and scipy.linalg.sqrtm of it.
- ms_ssim: image pairs (28x28, values in [-1, 1]) and MS-SSIM from an independent
  implementation here: 2-D Gaussian window (outer product, not separable passes) applied with
  scipy.signal.correlate2d 'valid', 3 scales, window 7, sigma 1.5, data range 2, K1 0.01,
  K2 0.03, Wang et al.'s first three weights renormalized, 2x2 average pooling between scales,
  cs and the last scale's SSIM clamped at 0 before the powers (pytorch_msssim's rule).
"""
import argparse
import json
import os

import numpy as np
import scipy.linalg
import scipy.signal


def frechet(f1, f2):
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2)
    covmean = np.real(covmean)
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def gaussian_window(size=7, sigma=1.5):
    d = np.arange(size) - (size - 1) / 2.0
    g = np.exp(-d ** 2 / (2 * sigma ** 2))
    g /= g.sum()
    return np.outer(g, g)


def ssim_maps(x, y, win, c1, c2):
    f = lambda img: scipy.signal.correlate2d(img, win, mode="valid")
    mx, my = f(x), f(y)
    vx = f(x * x) - mx ** 2
    vy = f(y * y) - my ** 2
    cxy = f(x * y) - mx * my
    cs = (2 * cxy + c2) / (vx + vy + c2)
    lum = (2 * mx * my + c1) / (mx ** 2 + my ** 2 + c1)
    return (lum * cs).mean(), cs.mean()


def pool2(img):
    h, w = img.shape[0] // 2 * 2, img.shape[1] // 2 * 2
    img = img[:h, :w]
    return 0.25 * (img[0::2, 0::2] + img[0::2, 1::2] + img[1::2, 0::2] + img[1::2, 1::2])


def ms_ssim(x, y, scales=3, window=7, sigma=1.5, data_range=2.0):
    weights = np.array([0.0448, 0.2856, 0.3001, 0.2363, 0.1333][:scales])
    weights = weights / weights.sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    win = gaussian_window(window, sigma)
    value = 1.0
    for s in range(scales):
        ssim, cs = ssim_maps(x, y, win, c1, c2)
        term = ssim if s == scales - 1 else cs
        value *= max(term, 0.0) ** weights[s]
        x, y = pool2(x), pool2(y)
    return float(value)


def smooth_image(rng, size=28):
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.zeros((size, size))
    for _ in range(3):
        fx, fy, ph = rng.uniform(0.5, 3), rng.uniform(0.5, 3), rng.uniform(0, 2 * np.pi)
        img += rng.uniform(0.3, 1) * np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
    return np.clip(img / 2, -1, 1)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "golden",
                                            "gan_metrics.json"))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=default)
    args = ap.parse_args()
    rng = np.random.default_rng(2026)

    out = {"generator": "tools/reference/make_gan_metrics_golden.py",
           "numpy": np.__version__, "scipy": scipy.__version__,
           "frechet": [], "sqrtm": [], "ms_ssim": []}
    for name, n1, n2, d in [("well_conditioned", 200, 150, 8), ("rank_deficient", 12, 10, 16)]:
        mix = rng.normal(size=(d, d))
        f1 = rng.normal(size=(n1, d)) @ mix
        f2 = rng.normal(size=(n2, d)) @ (mix + 0.3 * rng.normal(size=(d, d))) + 0.5
        f1, f2 = np.round(f1, 6), np.round(f2, 6)  # short in the file, exact in both programs
        out["frechet"].append({"name": name, "d": d, "f1": f1.ravel().tolist(),
                               "n1": n1, "f2": f2.ravel().tolist(), "n2": n2,
                               "distance": frechet(f1, f2)})
    a = rng.normal(size=(10, 10))
    a = np.round(a, 6)
    psd = a @ a.T
    out["sqrtm"].append({"n": 10, "a": psd.ravel().tolist(),
                         "sqrt": np.real(scipy.linalg.sqrtm(psd)).ravel().tolist()})

    base = smooth_image(rng)
    shifted = np.roll(base, 2, axis=1)
    noisy = np.clip(base + 0.2 * rng.normal(size=base.shape), -1, 1)
    noise1 = rng.uniform(-1, 1, size=base.shape)
    noise2 = rng.uniform(-1, 1, size=base.shape)
    r4 = lambda img: np.round(img, 4)
    base, shifted, noisy, noise1, noise2 = map(r4, (base, shifted, noisy, noise1, noise2))
    for name, x, y in [("identical", base, base), ("noisy_copy", base, noisy),
                       ("shifted", base, shifted), ("noise", noise1, noise2)]:
        out["ms_ssim"].append({"name": name, "x": x.ravel().tolist(), "y": y.ravel().tolist(),
                               "value": ms_ssim(x, y)})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    for case in out["frechet"]:
        print("frechet", case["name"], case["distance"])
    for case in out["ms_ssim"]:
        print("ms_ssim", case["name"], case["value"])
    print("wrote", args.out, os.path.getsize(args.out), "bytes")


if __name__ == "__main__":
    main()
