"""round / convert / inspect against ml_dtypes (an implementation that shares nothing with ours)."""
import ml_dtypes
import numpy as np
import pytest

import mantissa as mt

ML = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
      "fp8_e5m2": ml_dtypes.float8_e5m2, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
      "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn,
      "e8m0": ml_dtypes.float8_e8m0fnu}


def values():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17549435e-38,
                        3.4028235e38, 65504.0, 65520.0, 448.0, 464.0, 57344.0, 61440.0,
                        2.0**-24, 2.0**-25, 2.0**-9, 2.0**-10, 1.0 + 2.0**-8, 1.0 + 2.0**-7,
                        # the fp6/fp4 grids' ties and edges, and e8m0's ends
                        0.25, 0.75, 1.25, 2.5, 5.0, 6.0, 7.0, 7.5, 7.75, 28.0, 30.0, 0.0625,
                        0.03125, 0.09375, 2.0**-127, 2.0**-128, 1.5 * 2.0**-127, 2.0**127,
                        1.5 * 2.0**127], dtype=np.float32)
    # Values on and between the fp4/fp6 grids: quarter steps over their range, and their ties.
    small = (rng.integers(-128, 128, 100_000) / 16).astype(np.float32)
    return np.concatenate([special, -special, random_bits, small,
                           rng.normal(0, 1, 100_000).astype(np.float32),
                           rng.normal(0, 1e-3, 100_000).astype(np.float32)])


@pytest.mark.parametrize("fmt", list(ML))
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
    # fp4: stochastic rounding between 2 and 3 is unbiased; the array type is ml_dtypes'.
    z = np.full(100_000, 2.25, dtype=np.float32)
    q = mt.convert(z, "fp4_e2m1", rounding="stochastic", seed=3)
    assert q.dtype == ml_dtypes.float4_e2m1fn
    assert set(np.unique(q.astype(np.float32))) == {2.0, 3.0}
    assert abs(q.astype(np.float32).mean() - 2.25) < 0.01
    with pytest.raises(mt.Error, match="unknown storage format"):
        mt.convert(z, "tf32")


def test_inspect_reports_every_format():
    r = mt.inspect("12.31")
    assert list(r) == ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2",
                       "fp4_e2m1", "e8m0"]
    assert r["bf16"]["hex"] == "0x4145" and r["bf16"]["value"] == 12.3125
    assert r["fp8_e4m3"]["value"] == 12.0
    assert r["fp4_e2m1"]["value"] == 6.0 and r["fp4_e2m1"]["overflow"]
    assert r["e8m0"]["value"] == 16.0 and r["e8m0"]["sign"] == ""
    assert mt.inspect(1e6)["fp16"]["overflow"]
    with pytest.raises(mt.Error, match="not a number"):
        mt.inspect("twelve")
