"""Pack and unpack block bytes (push constants, std430 buffers) by reflected offsets.

Rules:

* Offsets, strides and sizes come from :mod:`gpu.spirv` (the compiler's
  ``Offset``/``ArrayStride`` decorations), never from hand-written formats: a
  ``uint64_t`` after a ``uint`` is written at offset 8, where the shader reads it.
* ``pack`` refuses, with the member's path in the message: a missing member, an
  extra key, a vector or array of the wrong length, a non-integer for an integer
  member, an integer outside its type's range, a finite float that would overflow
  its width, and a block larger than the device's ``maxPushConstantsSize``.
* Padding bytes are zero. Values round-trip exactly through ``unpack`` when they
  are representable in the member's type (floats are rounded to their width).
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpu.errors import LayoutError
from gpu.spirv import Array, Block, Matrix, Member, RuntimeArray, Scalar, Struct, Type, Vector

_FORMATS: dict[tuple[str, int], str] = {
    ("uint", 8): "B", ("uint", 16): "H", ("uint", 32): "I", ("uint", 64): "Q",
    ("int", 8): "b", ("int", 16): "h", ("int", 32): "i", ("int", 64): "q",
    ("float", 16): "e", ("float", 32): "f", ("float", 64): "d",
    ("bool", 32): "I",
}
_FLOAT_MAX = {16: 65504.0, 32: float(np.finfo(np.float32).max), 64: float(np.finfo(np.float64).max)}


def _fmt(t: Scalar) -> str:
    try:
        return "<" + _FORMATS[(t.kind, t.width)]
    except KeyError:
        raise LayoutError(f"scalar type {t} is not supported in a block") from None


def _check_scalar(path: str, t: Scalar, value: Any) -> int | float:
    if t.kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise LayoutError(f"{path} is a bool; got {value!r} ({type(value).__name__}); pass True or False")
        return int(bool(value))
    if t.kind in ("uint", "int"):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise LayoutError(
                f"{path} is {t}; got {value!r} ({type(value).__name__}); pass an integer"
            )
        v = int(value)
        lo, hi = (0, 2**t.width - 1) if t.kind == "uint" else (-(2 ** (t.width - 1)), 2 ** (t.width - 1) - 1)
        if not lo <= v <= hi:
            raise LayoutError(f"{path} is {t}; {v} is out of range [{lo}, {hi}]")
        return v
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise LayoutError(f"{path} is {t}; got {value!r} ({type(value).__name__}); pass a number")
    f = float(value)
    if math.isfinite(f) and abs(f) > _FLOAT_MAX[t.width]:
        raise LayoutError(
            f"{path} is {t}; {f!r} is out of range (largest finite {t} is {_FLOAT_MAX[t.width]!r})"
        )
    return f


def _sequence(path: str, value: Any, length: int, what: str) -> Sequence[Any]:
    if isinstance(value, np.ndarray):
        value = list(value)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise LayoutError(f"{path} is {what}; got {value!r}; pass a sequence of {length}")
    if len(value) != length:
        raise LayoutError(f"{path} is {what}; got {len(value)} values, expected {length}")
    return value


def _pack_value(buf: bytearray, offset: int, t: Type, value: Any, path: str) -> None:
    if isinstance(t, Scalar):
        struct.pack_into(_fmt(t), buf, offset, _check_scalar(path, t, value))
    elif isinstance(t, Vector):
        seq = _sequence(path, value, t.count, str(t))
        for i, v in enumerate(seq):
            _pack_value(buf, offset + i * t.component.size, t.component, v, f"{path}[{i}]")
    elif isinstance(t, Matrix):
        cols = _sequence(path, value, t.columns, str(t))
        for c, col in enumerate(cols):
            rows = _sequence(f"{path}[{c}]", col, t.column.count, str(t.column))
            for r, v in enumerate(rows):
                vec, comp = (r, c) if t.row_major else (c, r)
                _pack_value(buf, offset + vec * t.stride + comp * t.column.component.size,
                            t.column.component, v, f"{path}[{c}][{r}]")
    elif isinstance(t, Array):
        if t.length is None:
            raise LayoutError(f"{path} has a specialization-constant length; it cannot be packed")
        seq = _sequence(path, value, t.length, str(t))
        for i, v in enumerate(seq):
            _pack_value(buf, offset + i * t.stride, t.element, v, f"{path}[{i}]")
    elif isinstance(t, RuntimeArray):
        raise LayoutError(f"{path} is a runtime array; bind a buffer for it instead of packing it")
    else:
        _pack_struct(buf, offset, t, value, path)


def _pack_struct(buf: bytearray, offset: int, t: Struct, value: Any, path: str) -> None:
    if not isinstance(value, Mapping):
        raise LayoutError(f"{path} is struct {t.name}; got {value!r}; pass a dict of its members")
    names = [m.name for m in t.members]
    missing = [n for n in names if n not in value]
    if missing:
        raise LayoutError(
            f"{path} is missing {', '.join(repr(n) for n in missing)}; "
            f"struct {t.name} needs: {', '.join(names)}"
        )
    extra = sorted(str(k) for k in value if k not in names)
    if extra:
        raise LayoutError(
            f"{path} has no member {', '.join(repr(k) for k in extra)}; "
            f"struct {t.name} has: {', '.join(names)}"
        )
    for m in t.members:
        _pack_value(buf, offset + m.offset, m.type, value[m.name], f"{path}.{m.name}")


def padded_size(struct_: Struct) -> int:
    """The block's size rounded up to 4 bytes, as a push-constant range must be."""
    return (struct_.size + 3) // 4 * 4


def pack(block: Block | Struct, values: Mapping[str, Any], *, limit: int | None = None) -> bytes:
    """Bytes of ``block`` with ``values`` at the reflected offsets.

    ``limit`` is the device's ``maxPushConstantsSize``; a larger block is refused.
    """
    st = block.struct if isinstance(block, Block) else block
    size = padded_size(st)
    if limit is not None and size > limit:
        raise LayoutError(
            f"push-constant block {st.name!r} is {size} bytes; the device allows {limit} "
            "(maxPushConstantsSize); move members to a storage buffer"
        )
    buf = bytearray(size)
    _pack_struct(buf, 0, st, values, st.name)
    return bytes(buf)


def _unpack_value(data: bytes | memoryview, offset: int, t: Type) -> Any:
    if isinstance(t, Scalar):
        v = struct.unpack_from(_fmt(t), data, offset)[0]
        return bool(v) if t.kind == "bool" else v
    if isinstance(t, Vector):
        return [_unpack_value(data, offset + i * t.component.size, t.component) for i in range(t.count)]
    if isinstance(t, Matrix):
        out = []
        for c in range(t.columns):
            col = []
            for r in range(t.column.count):
                vec, comp = (r, c) if t.row_major else (c, r)
                col.append(_unpack_value(data, offset + vec * t.stride + comp * t.column.component.size,
                                         t.column.component))
            out.append(col)
        return out
    if isinstance(t, Array):
        return [_unpack_value(data, offset + i * t.stride, t.element) for i in range(t.length or 0)]
    if isinstance(t, RuntimeArray):
        return []
    return {m.name: _unpack_value(data, offset + m.offset, m.type) for m in t.members}


def unpack(block: Block | Struct, data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The members of ``block`` read from ``data`` at the reflected offsets (runtime arrays as [])."""
    st = block.struct if isinstance(block, Block) else block
    if len(data) < st.size:
        raise LayoutError(f"block {st.name!r} needs {st.size} bytes; got {len(data)}")
    return _unpack_value(memoryview(bytes(data)), 0, st)


def describe(block: Block | Struct) -> list[tuple[str, int, int, str]]:
    """(member, offset, size, type) rows of the block's top level, for messages and docs."""
    st = block.struct if isinstance(block, Block) else block
    return [(m.name, m.offset, m.size, str(m.type)) for m in st.members]


def member(block: Block | Struct, name: str) -> Member:
    """The top-level member ``name`` of ``block``."""
    st = block.struct if isinstance(block, Block) else block
    return st.member(name)
