"""Push constants on a real device: shaders echo them back, every value exactly."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpu
from gpu import std430

pytestmark = pytest.mark.gpu

F32 = st.floats(width=32, allow_nan=False)
ECHO_VALUES = st.fixed_dictionaries({
    "a": st.integers(0, 2**32 - 1), "b": st.integers(0, 2**64 - 1), "c": F32,
    "d": st.integers(-(2**63), 2**63 - 1), "e": st.floats(allow_nan=False),
    "f": st.lists(F32, min_size=3, max_size=3), "g": F32,
    "h": st.lists(st.integers(-(2**31), 2**31 - 1), min_size=3, max_size=3),
    "k": st.lists(st.floats(allow_nan=False), min_size=2, max_size=2),
    "m": st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2), "n": st.integers(-(2**31), 2**31 - 1),
})


def echo(pipe: gpu.Pipeline, push: dict | bytes) -> dict:
    out_block = pipe.reflection.binding(0)
    with gpu.Buffer(pipe.device, 256) as out:
        out.view()[:] = 0xAB
        gpu.dispatch(pipe, 1, {0: out}, push)
        return std430.unpack(out_block, out.read())


def test_every_member_round_trips_exactly(device: gpu.Device) -> None:
    values = dict(a=0xFFFFFFFF, b=2**64 - 2, c=-3.25, d=-(2**63), e=1 / 3, f=[1.5, -2.5, float(np.float32(1e30))],
                  g=7.0, h=[-1, 0, 2**31 - 1], k=[2.0**-1074, -1e308], m=[1, 2**32 - 1], n=-(2**31))
    with gpu.Compute(device, "echo_push") as pipe:
        assert echo(pipe, values) == values


@settings(max_examples=15, deadline=None)
@given(values=ECHO_VALUES)
def test_random_values_round_trip(device: gpu.Device, values: dict) -> None:
    with gpu.Compute(device, "echo_push") as pipe:
        assert echo(pipe, values) == values


def test_tight_packing_would_have_failed(device: gpu.Device) -> None:
    values = {"a": 7, "b": 0x0123456789ABCDEF, "c": 2.5}
    with gpu.Compute(device, "echo_tight") as pipe:
        assert echo(pipe, values) == values
        tight = struct.pack("<IQf", values["a"], values["b"], values["c"])
        raw = tight + b"\0" * (pipe.push_size - len(tight))
        got = echo(pipe, raw)
    assert got["a"] == 7
    assert got["b"] != values["b"]
    assert got["c"] != values["c"]


def test_push_block_over_the_device_limit_is_refused(device: gpu.Device, compile_glsl) -> None:  # type: ignore[no-untyped-def]
    words = device.info.max_push_constants_size // 16 + 1
    code = compile_glsl(f"""#version 450
layout(local_size_x = 1) in;
layout(push_constant) uniform Big {{ vec4 v[{words}]; }} pc;
layout(std430, binding = 0) buffer Out {{ vec4 o; }};
void main() {{ o = pc.v[{words - 1}]; }}
""")
    with pytest.raises(gpu.GpuError, match=r"bytes; .* allows \d+ \(maxPushConstantsSize\)"):
        gpu.Compute(device, code)


def test_values_arrive_through_numpy_views(device: gpu.Device) -> None:
    with gpu.Compute(device, "echo_tight") as pipe, gpu.Buffer(device, 64) as out:
        gpu.dispatch(pipe, 1, {0: out}, {"a": 1, "b": 2**33, "c": 0.5})
        assert int(out.view(np.uint64, 3)[1]) == 2**33
        assert out.view(np.float32, 6)[4] == 0.5
