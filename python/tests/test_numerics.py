"""round / convert / inspect against ml_dtypes (an implementation that shares nothing with ours)."""
import ml_dtypes
import numpy as np
import pytest

import mantissa as mt

ML = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
      "fp8_e5m2": ml_dtypes.float8_e5m2}


def values():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17549435e-38,
                        3.4028235e38, 65504.0, 65520.0, 448.0, 464.0, 57344.0, 61440.0,
                        2.0**-24, 2.0**-25, 2.0**-9, 2.0**-10, 1.0 + 2.0**-8, 1.0 + 2.0**-7],
                       dtype=np.float32)
    return np.concatenate([special, -special, random_bits,
                           rng.normal(0, 1, 100_000).astype(np.float32),
                           rng.normal(0, 1e-3, 100_000).astype(np.float32)])


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_convert_and_round_match_ml_dtypes_bit_for_bit(fmt):
    x = values()
    if fmt == "fp8_e4m3":
        x = x[np.abs(x) < 464]  # ml_dtypes' e4m3fn overflows to NaN, as ours without saturation
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(ML[fmt])
    ours = mt.convert(x, fmt)
    assert ours.dtype == ref.dtype
    bits = np.uint8 if ours.itemsize == 1 else np.uint16
    ref_bits, our_bits = ref.view(bits), ours.view(bits)
    nan = np.isnan(ref.astype(np.float32))
    assert np.array_equal(np.isnan(ours.astype(np.float32)), nan)
    np.testing.assert_array_equal(our_bits[~nan], ref_bits[~nan])
    rounded = mt.round(x, fmt)
    np.testing.assert_array_equal(rounded[~nan], ref.astype(np.float32)[~nan])


def test_saturation_truncation_and_stochastic_rounding():
    x = np.array([500.0, -1e6, 1.0 + 2.0**-8 + 2.0**-10], dtype=np.float32)
    sat = mt.convert(x[:2], "fp8_e4m3", saturate=True).astype(np.float32)
    np.testing.assert_array_equal(sat, [448.0, -448.0])
    assert mt.round(x[2:], "bf16", rounding="truncate")[0] == 1.0
    # Stochastic: unbiased on average, reproducible per seed, different across seeds.
    y = np.full(100_000, 1.0 + 2.0**-9, dtype=np.float32)
    a = mt.round(y, "bf16", rounding="stochastic", seed=1)
    assert set(np.unique(a)) == {1.0, 1.0 + 2.0**-7}
    assert abs(a.mean() - y[0]) < 1e-4
    np.testing.assert_array_equal(a, mt.round(y, "bf16", rounding="stochastic", seed=1))
    assert not np.array_equal(a, mt.round(y, "bf16", rounding="stochastic", seed=2))
    with pytest.raises(mt.Error, match="unknown format"):
        mt.round(y, "bf17")


def test_inspect_reports_every_format():
    r = mt.inspect("12.31")
    assert set(r) == {"fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}
    assert r["bf16"]["hex"] == "0x4145" and r["bf16"]["value"] == 12.3125
    assert r["fp8_e4m3"]["value"] == 12.0
    assert mt.inspect(1e6)["fp16"]["overflow"]
    with pytest.raises(mt.Error, match="not a number"):
        mt.inspect("twelve")
