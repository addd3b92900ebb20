"""The push-constant packer: reflected offsets, and refusals with clear messages."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu import spirv, std430
from gpu.errors import LayoutError
from gpu.pipeline import shader_path

ECHO = spirv.reflect(shader_path("echo_push")).push_constants
TIGHT = spirv.reflect(shader_path("echo_tight")).push_constants
F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def values(**over):  # type: ignore[no-untyped-def]
    base = dict(a=1, b=2**40 + 3, c=1.5, d=-(2**40), e=0.1, f=[1.0, 2.0, 3.0], g=4.0,
                h=[1, -2, 3], k=[0.25, -1e300], m=[7, 8], n=-9)
    base.update(over)
    return base


def test_pack_puts_64_bit_members_at_their_offsets() -> None:
    raw = std430.pack(ECHO, values())
    assert len(raw) == 108
    assert struct.unpack_from("<Q", raw, 8)[0] == 2**40 + 3
    assert struct.unpack_from("<q", raw, 24)[0] == -(2**40)
    assert struct.unpack_from("<d", raw, 32)[0] == 0.1
    assert struct.unpack_from("<3f", raw, 48) == (1.0, 2.0, 3.0)
    assert struct.unpack_from("<f", raw, 60)[0] == 4.0
    assert raw[4:8] == b"\0\0\0\0"  # padding is zero


def test_tight_struct_pack_disagrees_with_the_layout() -> None:
    tight = struct.pack("<IQf", 1, 2**40 + 3, 1.5)
    padded = tight + b"\0" * (std430.padded_size(TIGHT.struct) - len(tight))
    got = std430.unpack(TIGHT, padded)
    assert got["b"] != 2**40 + 3
    assert std430.unpack(TIGHT, std430.pack(TIGHT, {"a": 1, "b": 2**40 + 3, "c": 1.5})) == {
        "a": 1, "b": 2**40 + 3, "c": 1.5}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"a": -1}, r"Params.a is uint32; -1 is out of range \[0, 4294967295\]"),
        ({"b": 2**64}, r"Params.b is uint64; 18446744073709551616 is out of range"),
        ({"d": 2**63}, r"Params.d is int64; .* out of range"),
        ({"c": 1e39}, r"Params.c is float32; 1e\+39 is out of range"),
        ({"a": 1.5}, r"Params.a is uint32; got 1.5 \(float\); pass an integer"),
        ({"a": True}, r"pass an integer"),
        ({"c": "x"}, r"Params.c is float32; got 'x' \(str\); pass a number"),
        ({"f": [1.0, 2.0]}, r"Params.f is float32x3; got 2 values, expected 3"),
        ({"h": [1, 2, 3, 4]}, r"Params.h is int32\[3\]; got 4 values, expected 3"),
        ({"h": [1, 2**31, 3]}, r"Params.h\[1\] is int32; 2147483648 is out of range"),
        ({"f": 3.0}, r"Params.f is float32x3; got 3.0; pass a sequence of 3"),
    ],
)
def test_pack_refuses_bad_values(change: dict, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        std430.pack(ECHO, values(**change))


def test_pack_refuses_missing_and_extra_members() -> None:
    v = values()
    del v["d"]
    with pytest.raises(LayoutError, match=r"Params is missing 'd'; struct Params needs: a, b, c, d"):
        std430.pack(ECHO, v)
    with pytest.raises(LayoutError, match=r"Params has no member 'zz'; struct Params has: a, b"):
        std430.pack(ECHO, values(zz=1))


def test_pack_refuses_a_block_over_the_device_limit() -> None:
    with pytest.raises(LayoutError, match=r"108 bytes; the device allows 64 \(maxPushConstantsSize\)"):
        std430.pack(ECHO, values(), limit=64)
    assert len(std430.pack(ECHO, values(), limit=128)) == 108


def test_numpy_scalars_and_arrays_are_accepted() -> None:
    v = values(a=np.uint32(5), c=np.float32(2.5), f=np.array([1, 2, 3], np.float32), h=np.arange(3))
    got = std430.unpack(ECHO, std430.pack(ECHO, v))
    assert got["a"] == 5 and got["c"] == 2.5 and got["f"] == [1.0, 2.0, 3.0] and got["h"] == [0, 1, 2]


def test_describe_lists_the_top_level() -> None:
    rows = std430.describe(TIGHT)
    assert rows == [("a", 0, 4, "uint32"), ("b", 8, 8, "uint64"), ("c", 16, 4, "float32")]


@settings(max_examples=200, deadline=None)
@given(
    a=st.integers(0, 2**32 - 1), b=st.integers(0, 2**64 - 1), c=F32, d=st.integers(-(2**63), 2**63 - 1),
    e=st.floats(allow_nan=False), f=st.lists(F32, min_size=3, max_size=3), g=F32,
    h=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=3, max_size=3),
    k=st.lists(st.floats(allow_nan=False), min_size=2, max_size=2),
    m=st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2), n=st.integers(-(2**31), 2**31 - 1),
)
def test_pack_unpack_round_trips(**v) -> None:  # type: ignore[no-untyped-def]
    assert std430.unpack(ECHO, std430.pack(ECHO, v)) == v
