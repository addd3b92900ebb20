"""The SPIR-V reader: block layouts come from the compiler's decorations."""

from __future__ import annotations

import struct

import pytest

from gpu import spirv
from gpu.errors import ShaderError
from gpu.pipeline import shader_path
from gpu.spirv import Array, Scalar, Vector


def test_echo_block_offsets_follow_std430() -> None:
    r = spirv.reflect(shader_path("echo_push"))
    layout = {m.name: (m.offset, m.size, str(m.type)) for m in r.push_constants.struct.members}
    assert layout["a"] == (0, 4, "uint32")
    assert layout["b"] == (8, 8, "uint64")  # not 4: a 64-bit member is 8-aligned
    assert layout["c"] == (16, 4, "float32")
    assert layout["d"] == (24, 8, "int64")
    assert layout["e"] == (32, 8, "float64")
    assert layout["f"] == (48, 12, "float32x3")  # vec3 is 16-aligned
    assert layout["g"] == (60, 4, "float32")  # packs into the vec3's fourth slot
    assert layout["h"][0] == 64 and layout["k"][0] == 80
    assert r.push_constants.size == 108
    assert r.push_constants.kind == "push_constant"


def test_arrays_carry_their_stride() -> None:
    st = spirv.reflect(shader_path("echo_push")).push_constants.struct
    h, k = st.member("h").type, st.member("k").type
    assert isinstance(h, Array) and h.length == 3 and h.stride == 4 and h.element == Scalar("int", 32)
    assert isinstance(k, Array) and k.length == 2 and k.stride == 8 and k.element == Scalar("float", 64)
    assert st.member("f").type == Vector(Scalar("float", 32), 3)


def test_storage_blocks_have_binding_and_access() -> None:
    r = spirv.reflect(shader_path("bce_f32"))
    assert sorted(b for _, b in r.bindings) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert r.binding(0).readonly and not r.binding(0).writeonly
    assert r.binding(3).writeonly and not r.binding(3).readonly
    assert not r.binding(2).readonly and not r.binding(2).writeonly
    assert r.binding(0).kind == "storage"
    assert r.local_size_spec_ids == (0, None, None)
    with pytest.raises(ShaderError, match="no binding 0.9"):
        r.binding(9)


def test_texel_buffers_are_bindings() -> None:
    r = spirv.reflect(shader_path("bce_texel4"))
    kinds = {b: blk.kind for (_, b), blk in r.bindings.items()}
    assert kinds == {0: "uniform_texel", 1: "uniform_texel", 2: "storage_texel", 3: "storage_texel",
                     4: "uniform_texel", 5: "uniform_texel", 6: "storage_texel", 7: "storage_texel",
                     8: "uniform_texel"}
    assert r.binding(0).readonly and r.binding(0).variable == "logits"
    # the gradient is read through a uniform texel view (8) and written through a storage one (2)
    assert r.binding(2).writeonly and r.binding(8).variable == "grad_in"
    assert r.binding(3).writeonly and not r.binding(3).readonly
    assert r.binding(2).size == 0


def test_output_block_matches_push_block() -> None:
    r = spirv.reflect(shader_path("echo_push"))
    out = r.binding(0).struct
    assert [(m.name, m.offset) for m in out.members] == [
        (m.name, m.offset) for m in r.push_constants.struct.members
    ]


def test_member_lookup_names_the_members() -> None:
    st = spirv.reflect(shader_path("echo_tight")).push_constants.struct
    with pytest.raises(ShaderError, match="members: a, b, c"):
        st.member("zz")


def test_rejects_bytes_that_are_not_spirv() -> None:
    with pytest.raises(ShaderError, match="magic"):
        spirv.reflect(b"\x00" * 40)
    with pytest.raises(ShaderError, match="multiple of 4"):
        spirv.reflect(b"\x03\x02\x23\x07\x00")


def test_reads_a_big_endian_module() -> None:
    code = shader_path("echo_tight").read_bytes()
    words = struct.unpack(f"<{len(code) // 4}I", code)
    swapped = struct.pack(f">{len(words)}I", *words)
    assert spirv.reflect(swapped).push_constants.struct.member("b").offset == 8


def test_truncated_module_is_refused() -> None:
    code = shader_path("echo_tight").read_bytes()
    header = bytearray(code[:24])
    header[20:24] = struct.pack("<I", (9 << 16) | 5)  # an OpName claiming 9 words
    with pytest.raises(ShaderError, match="truncated"):
        spirv.reflect(bytes(header))


def test_missing_file_names_the_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ShaderError, match="nope.spv"):
        spirv.reflect(tmp_path / "nope.spv")
