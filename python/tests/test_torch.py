"""DLPack with PyTorch: both ways without copies, every dtype PyTorch has. Skipped where torch is
not installed (CI does not install PyTorch: its wheel is several GB)."""
import gc

import pytest

import mantissa as mt

torch = pytest.importorskip("torch")

DTYPES = [("f32", torch.float32), ("f64", torch.float64), ("f16", torch.float16),
          ("bf16", torch.bfloat16), ("i64", torch.int64), ("i32", torch.int32),
          ("u8", torch.uint8), ("bool", torch.bool)]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES += [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)]


@pytest.mark.parametrize("name,dtype", DTYPES)
def test_torch_round_trip_shares_memory(name, dtype):
    src = (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5).to(dtype)
    t = mt.from_dlpack(src)
    assert t.dtype == name and t.shape == (3, 4)
    assert t.data_ptr() == src.data_ptr()
    back = torch.from_dlpack(t)
    assert back.data_ptr() == src.data_ptr() and back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), src.view(torch.uint8))


def test_torch_lifetimes():
    src = torch.randn(100)
    t = mt.from_dlpack(src)
    expected = src.clone()
    del src
    gc.collect()
    assert torch.equal(torch.from_dlpack(t), expected)
    u = mt.normal([10, 10], seed=1)
    view = torch.from_dlpack(u)
    copy = view.clone()
    del u
    gc.collect()
    assert torch.equal(view, copy)
