"""Tensors and NumPy: zero-copy exchange through DLPack, every dtype, lifetimes."""
import gc

import ml_dtypes
import numpy as np
import pytest

import mantissa as mt

DTYPES = [  # mantissa dtype, NumPy dtype
    ("f64", np.float64), ("f32", np.float32), ("f16", np.float16), ("bf16", ml_dtypes.bfloat16),
    ("fp8_e4m3", ml_dtypes.float8_e4m3fn), ("fp8_e5m2", ml_dtypes.float8_e5m2),
    ("i64", np.int64), ("i32", np.int32), ("u8", np.uint8), ("bool", np.bool_),
]


def sample(np_dtype, shape=(3, 5)):
    values = np.arange(np.prod(shape)).reshape(shape) % 7 - 3
    if np_dtype == np.bool_:
        return values > 0
    if np_dtype == np.uint8:
        return (values + 3).astype(np.uint8)
    if np.dtype(np_dtype).kind == "i":
        return values.astype(np_dtype)
    return (values.astype(np.float32) / 4).astype(np_dtype)


@pytest.mark.parametrize("name,np_dtype", DTYPES)
def test_numpy_round_trip_shares_memory(name, np_dtype):
    a = sample(np_dtype)
    t = mt.from_numpy(a)
    assert t.dtype == name and t.shape == a.shape
    assert t.data_ptr() == a.ctypes.data  # no copy on the way in
    back = t.numpy()
    assert back.dtype == np.dtype(np_dtype)
    assert back.ctypes.data == a.ctypes.data  # nor on the way out
    np.testing.assert_array_equal(back.view(np.uint8), a.view(np.uint8))
    # A write through one is seen by the other.
    if name not in ("bool",):
        a.reshape(-1)[0] = a.reshape(-1)[1]
        assert back.reshape(-1)[0] == a.reshape(-1)[1]


@pytest.mark.parametrize("name,np_dtype", [d for d in DTYPES if d[0] in ("f64", "f32", "f16", "i64", "i32", "u8", "bool")])
def test_numpy_dlpack_both_ways(name, np_dtype):
    a = sample(np_dtype)
    t = mt.from_dlpack(a)
    assert t.data_ptr() == a.ctypes.data
    b = np.from_dlpack(t)
    assert b.ctypes.data == a.ctypes.data and b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)


def test_strided_views_keep_their_strides():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[::2, 1::2]  # non-contiguous
    t = mt.from_numpy(view)
    assert t.shape == (2, 3)
    np.testing.assert_array_equal(t.contiguous().numpy(), view)
    np.testing.assert_array_equal(np.asarray(t.to("f64")), view.astype(np.float64))
    neg = base[::-1]
    np.testing.assert_array_equal(mt.from_numpy(neg).contiguous().numpy(), neg)


def test_channels_last():
    a = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    t = mt.from_numpy(a).contiguous("channels_last")
    assert t.is_contiguous("channels_last") and not t.is_contiguous()
    assert t.strides == (60, 1, 15, 3)
    np.testing.assert_array_equal(t.numpy(), a)  # the same values, NHWC in memory
    np.testing.assert_array_equal(t.contiguous().numpy(), a)
    with pytest.raises(mt.Error, match="channels_last"):
        t.contiguous("nhwc")


def test_the_producer_deleted_first_does_not_free_the_memory():
    a = np.arange(1000, dtype=np.float32)
    t = mt.from_numpy(a)
    ptr = t.data_ptr()
    del a
    gc.collect()
    assert t.data_ptr() == ptr
    assert float(mt.sum(t).item()) == sum(range(1000))
    # And the other way: a NumPy view outlives the tensor.
    u = mt.normal([64, 64], seed=3)
    expected = u.numpy().copy()
    view = u.numpy()
    del u
    gc.collect()
    np.testing.assert_array_equal(view, expected)


def test_ops_autograd_and_errors():
    x = mt.tensor([[1.0, -2.0], [3.0, 4.0]]).requires_grad_()
    y = mt.sum(mt.relu(x) * 2.0)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[2, 0], [2, 2]])
    assert y.item() == 16.0
    with pytest.raises(mt.Error, match="unknown device 'f24'"):
        x.to("f24")
    with pytest.raises(ValueError):  # mantissa.Error is a ValueError
        mt.matmul(mt.zeros([2, 3]), mt.zeros([2, 3]))
    with mt.no_grad():
        z = x * 3.0
    assert not z.requires_grad


def test_version():
    assert mt.__version__.count(".") == 2
