"""A small SPIR-V reader: the blocks a compute shader declares, with their layout.

Rules:

* Layout comes only from the module itself: member offsets from
  ``OpMemberDecorate ... Offset``, array strides from ``OpDecorate ... ArrayStride``,
  matrix strides from ``MatrixStride``, sizes from the type declarations. Nothing is
  recomputed by hand, so a 64-bit member after a 32-bit one sits where the compiler
  put it (offset 8, not 4).
* Blocks are the push-constant block and every descriptor-bound block (storage
  buffers in either SPIR-V spelling: ``StorageBuffer`` storage class, or ``Uniform``
  with ``BufferBlock``; and uniform buffers). Texel buffers (``samplerBuffer``,
  ``imageBuffer``) are bindings of kind ``uniform_texel`` / ``storage_texel`` with
  an empty struct.
* Specialization constants are not evaluated: an array whose length is a
  specialization constant gets ``length=None``; such arrays only appear in shared
  memory, never in the blocks read here.
* Names come from ``OpName``/``OpMemberName``; a module stripped of names gets
  ``_<index>`` member names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from gpu.errors import ShaderError

MAGIC = 0x07230203

# opcodes
_OP_NAME, _OP_MEMBER_NAME, _OP_ENTRY_POINT, _OP_EXECUTION_MODE = 5, 6, 15, 16
_OP_TYPE_IMAGE, _OP_TYPE_SAMPLED_IMAGE = 25, 27
_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX = 20, 21, 22, 23, 24
_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER = 28, 29, 30, 32
_OP_CONSTANT, _OP_SPEC_CONSTANT, _OP_SPEC_CONSTANT_COMPOSITE, _OP_VARIABLE = 43, 50, 51, 59
_OP_DECORATE, _OP_MEMBER_DECORATE, _OP_EXECUTION_MODE_ID = 71, 72, 331

# decorations
_DEC_SPEC_ID, _DEC_BLOCK, _DEC_BUFFER_BLOCK, _DEC_ROW_MAJOR = 1, 2, 3, 4
_DEC_ARRAY_STRIDE, _DEC_MATRIX_STRIDE, _DEC_NON_WRITABLE, _DEC_NON_READABLE = 6, 7, 24, 25
_DEC_BUILTIN, _DEC_BINDING, _DEC_DESCRIPTOR_SET, _DEC_OFFSET = 11, 33, 34, 35
_BUILTIN_WORKGROUP_SIZE = 25

# storage classes and execution modes
_SC_UNIFORM_CONSTANT, _SC_UNIFORM, _SC_PUSH_CONSTANT, _SC_STORAGE_BUFFER = 0, 2, 9, 12
_DIM_BUFFER = 5
_MODE_LOCAL_SIZE, _MODE_LOCAL_SIZE_ID = 17, 38


@dataclass(frozen=True)
class Scalar:
    """A scalar: ``kind`` is ``uint``, ``int``, ``float`` or ``bool``; ``width`` in bits."""

    kind: str
    width: int

    @property
    def size(self) -> int:
        return 4 if self.kind == "bool" else self.width // 8

    def __str__(self) -> str:
        return f"{self.kind}{self.width}"


@dataclass(frozen=True)
class Vector:
    """A vector of ``count`` components."""

    component: Scalar
    count: int

    @property
    def size(self) -> int:
        return self.component.size * self.count

    def __str__(self) -> str:
        return f"{self.component}x{self.count}"


@dataclass(frozen=True)
class Matrix:
    """A matrix of ``columns`` column vectors, ``stride`` bytes apart (row-major flips the roles)."""

    column: Vector
    columns: int
    stride: int = 0
    row_major: bool = False

    @property
    def size(self) -> int:
        vectors = self.column.count if self.row_major else self.columns
        return vectors * self.stride

    def __str__(self) -> str:
        return f"mat{self.columns}x{self.column.count}<{self.column.component}>"


@dataclass(frozen=True)
class Array:
    """A sized array (``length`` None when it is a specialization constant)."""

    element: "Type"
    length: int | None
    stride: int

    @property
    def size(self) -> int:
        return (self.length or 0) * self.stride

    def __str__(self) -> str:
        return f"{self.element}[{self.length if self.length is not None else '?'}]"


@dataclass(frozen=True)
class RuntimeArray:
    """An unsized trailing array of a storage block; its size is the binding's range."""

    element: "Type"
    stride: int

    @property
    def size(self) -> int:
        return 0

    def __str__(self) -> str:
        return f"{self.element}[]"


@dataclass(frozen=True)
class Member:
    """One member of a struct, at its decorated byte offset."""

    name: str
    type: "Type"
    offset: int

    @property
    def size(self) -> int:
        return self.type.size

    @property
    def end(self) -> int:
        return self.offset + self.type.size


@dataclass(frozen=True)
class Struct:
    """A struct type; ``size`` is the end of its last member (a runtime array adds 0)."""

    name: str
    members: tuple[Member, ...]

    @property
    def size(self) -> int:
        return max((m.end for m in self.members), default=0)

    def member(self, name: str) -> Member:
        """The member called ``name``; raises ShaderError naming the members there are."""
        for m in self.members:
            if m.name == name:
                return m
        names = ", ".join(m.name for m in self.members)
        raise ShaderError(f"struct {self.name!r} has no member {name!r}; members: {names}")

    def __str__(self) -> str:
        return self.name


Type = Union[Scalar, Vector, Matrix, Array, RuntimeArray, Struct]


@dataclass(frozen=True)
class Block:
    """A block variable: the push constants or a descriptor-bound buffer.

    ``kind`` is ``push_constant``, ``storage``, ``uniform``, ``uniform_texel`` or
    ``storage_texel``. ``readonly`` and ``writeonly`` hold when the variable, or
    every member, carries NonWritable / NonReadable (a uniform texel buffer is
    readonly).
    """

    name: str
    variable: str
    kind: str
    struct: Struct
    set: int | None = None
    binding: int | None = None
    readonly: bool = False
    writeonly: bool = False

    @property
    def size(self) -> int:
        return self.struct.size


@dataclass(frozen=True)
class Reflection:
    """What a compute module declares: entry point, work-group size and blocks."""

    entry_point: str
    local_size: tuple[int, int, int] | None
    local_size_spec_ids: tuple[int | None, int | None, int | None] | None
    push_constants: Block | None
    bindings: dict[tuple[int, int], Block] = field(default_factory=dict)
    spec_ids: dict[str, int] = field(default_factory=dict)

    def binding(self, index: int, set: int = 0) -> Block:
        """The block at (``set``, ``index``); raises ShaderError naming the bindings there are."""
        try:
            return self.bindings[(set, index)]
        except KeyError:
            have = ", ".join(f"{s}.{b} {blk.variable or blk.name}" for (s, b), blk in sorted(self.bindings.items()))
            raise ShaderError(f"shader has no binding {set}.{index}; bindings: {have or 'none'}") from None


def _string(words: list[int]) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass
class _Module:
    names: dict[int, str] = field(default_factory=dict)
    member_names: dict[tuple[int, int], str] = field(default_factory=dict)
    decorations: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    member_decorations: dict[tuple[int, int], dict[int, list[int]]] = field(default_factory=dict)
    type_ops: dict[int, tuple[int, list[int]]] = field(default_factory=dict)
    constants: dict[int, int] = field(default_factory=dict)
    composites: dict[int, list[int]] = field(default_factory=dict)
    variables: list[tuple[int, int, int]] = field(default_factory=list)  # (pointer type, id, class)
    entry: tuple[int, str] | None = None
    local_size: tuple[int, int, int] | None = None
    local_size_ids: tuple[int, int, int] | None = None
    types: dict[int, Type] = field(default_factory=dict)


def _words(code: bytes) -> list[int]:
    if len(code) < 20 or len(code) % 4:
        raise ShaderError(f"not a SPIR-V module: {len(code)} bytes (need a multiple of 4, at least 20)")
    magic = struct.unpack_from("<I", code)[0]
    if magic == MAGIC:
        fmt = "<"
    elif magic == int.from_bytes(MAGIC.to_bytes(4, "little"), "big"):
        fmt = ">"
    else:
        raise ShaderError(f"not a SPIR-V module: magic {magic:#010x}, expected {MAGIC:#010x}")
    return list(struct.unpack(f"{fmt}{len(code) // 4}I", code))


def _scan(words: list[int]) -> _Module:
    mod = _Module()
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise ShaderError(f"truncated SPIR-V instruction at word {i} (opcode {op}, {count} words)")
        args = words[i + 1 : i + count]
        i += count
        if op == _OP_NAME:
            mod.names[args[0]] = _string(args[1:])
        elif op == _OP_MEMBER_NAME:
            mod.member_names[(args[0], args[1])] = _string(args[2:])
        elif op == _OP_ENTRY_POINT and mod.entry is None:
            mod.entry = (args[1], _string(args[2:]))
        elif op == _OP_EXECUTION_MODE and args[1] == _MODE_LOCAL_SIZE:
            mod.local_size = (args[2], args[3], args[4])
        elif op == _OP_EXECUTION_MODE_ID and args[1] == _MODE_LOCAL_SIZE_ID:
            mod.local_size_ids = (args[2], args[3], args[4])
        elif op == _OP_DECORATE:
            mod.decorations.setdefault(args[0], {})[args[1]] = args[2:]
        elif op == _OP_MEMBER_DECORATE:
            mod.member_decorations.setdefault((args[0], args[1]), {})[args[2]] = args[3:]
        elif op in (_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX,
                    _OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER,
                    _OP_TYPE_IMAGE, _OP_TYPE_SAMPLED_IMAGE):
            mod.type_ops[args[0]] = (op, args[1:])
        elif op == _OP_CONSTANT:
            mod.constants[args[1]] = args[2] | ((args[3] << 32) if len(args) > 3 else 0)
        elif op == _OP_SPEC_CONSTANT_COMPOSITE:
            mod.composites[args[1]] = args[2:]
        elif op == _OP_VARIABLE:
            mod.variables.append((args[0], args[1], args[2]))
    return mod


def _type(mod: _Module, tid: int) -> Type:
    if tid in mod.types:
        return mod.types[tid]
    if tid not in mod.type_ops:
        raise ShaderError(f"SPIR-V id %{tid} is not a data type this reader knows")
    op, a = mod.type_ops[tid]
    deco = mod.decorations.get(tid, {})
    t: Type
    if op == _OP_TYPE_BOOL:
        t = Scalar("bool", 32)
    elif op == _OP_TYPE_INT:
        t = Scalar("int" if a[1] else "uint", a[0])
    elif op == _OP_TYPE_FLOAT:
        t = Scalar("float", a[0])
    elif op == _OP_TYPE_VECTOR:
        comp = _type(mod, a[0])
        assert isinstance(comp, Scalar)
        t = Vector(comp, a[1])
    elif op == _OP_TYPE_MATRIX:
        col = _type(mod, a[0])
        assert isinstance(col, Vector)
        t = Matrix(col, a[1])
    elif op == _OP_TYPE_ARRAY:
        stride = deco.get(_DEC_ARRAY_STRIDE, [0])[0]
        t = Array(_type(mod, a[0]), mod.constants.get(a[1]), stride)
    elif op == _OP_TYPE_RUNTIME_ARRAY:
        t = RuntimeArray(_type(mod, a[0]), deco.get(_DEC_ARRAY_STRIDE, [0])[0])
    elif op == _OP_TYPE_STRUCT:
        t = _struct(mod, tid, a)
    else:
        raise ShaderError(f"SPIR-V id %{tid} is a pointer, not a data type")
    mod.types[tid] = t
    return t


def _struct(mod: _Module, tid: int, member_types: list[int]) -> Struct:
    members = []
    for index, mtid in enumerate(member_types):
        mdeco = mod.member_decorations.get((tid, index), {})
        mtype = _type(mod, mtid)
        if isinstance(mtype, Matrix):
            mtype = Matrix(mtype.column, mtype.columns, mdeco.get(_DEC_MATRIX_STRIDE, [0])[0],
                           _DEC_ROW_MAJOR in mdeco)
        if _DEC_OFFSET not in mdeco:
            raise ShaderError(
                f"member {index} of struct {mod.names.get(tid, tid)!r} has no Offset decoration; "
                "only explicitly laid-out blocks (std430/std140/push_constant) can be read"
            )
        name = mod.member_names.get((tid, index)) or f"_{index}"
        members.append(Member(name, mtype, mdeco[_DEC_OFFSET][0]))
    return Struct(mod.names.get(tid, f"struct_{tid}"), tuple(members))


def _texel(mod: _Module, sid: int, var: int) -> Block | None:
    """A texel-buffer binding (samplerBuffer / imageBuffer), or None for other images."""
    op, a = mod.type_ops.get(sid, (None, []))
    if op == _OP_TYPE_SAMPLED_IMAGE:
        op, a = mod.type_ops.get(a[0], (None, []))
        sampled = 1
    elif op == _OP_TYPE_IMAGE:
        sampled = a[5]
    else:
        return None
    if op != _OP_TYPE_IMAGE or a[1] != _DIM_BUFFER:
        return None
    vdeco = mod.decorations.get(var, {})
    name = mod.names.get(var, f"texel_{var}")
    return Block(
        name=name, variable=name, kind="uniform_texel" if sampled == 1 else "storage_texel",
        struct=Struct(name, ()), set=vdeco.get(_DEC_DESCRIPTOR_SET, [None])[0],
        binding=vdeco.get(_DEC_BINDING, [None])[0],
        readonly=sampled == 1 or _DEC_NON_WRITABLE in vdeco, writeonly=_DEC_NON_READABLE in vdeco,
    )


def _block(mod: _Module, ptr_type: int, var: int, storage: int) -> Block | None:
    op, a = mod.type_ops.get(ptr_type, (None, []))
    if op != _OP_TYPE_POINTER:
        return None
    sid = a[1]
    if storage == _SC_UNIFORM_CONSTANT:
        return _texel(mod, sid, var)
    sdeco = mod.decorations.get(sid, {})
    if storage == _SC_PUSH_CONSTANT:
        kind = "push_constant"
    elif storage == _SC_STORAGE_BUFFER or (storage == _SC_UNIFORM and _DEC_BUFFER_BLOCK in sdeco):
        kind = "storage"
    elif storage == _SC_UNIFORM and _DEC_BLOCK in sdeco:
        kind = "uniform"
    else:
        return None
    st = _type(mod, sid)
    if not isinstance(st, Struct):
        return None
    count = len(st.members)
    flags = [mod.member_decorations.get((sid, i), {}) for i in range(count)]
    vdeco = mod.decorations.get(var, {})
    readonly = _DEC_NON_WRITABLE in vdeco or (count > 0 and all(_DEC_NON_WRITABLE in f for f in flags))
    writeonly = _DEC_NON_READABLE in vdeco or (count > 0 and all(_DEC_NON_READABLE in f for f in flags))
    return Block(
        name=st.name,
        variable=mod.names.get(var, ""),
        kind=kind,
        struct=st,
        set=vdeco.get(_DEC_DESCRIPTOR_SET, [None])[0] if kind != "push_constant" else None,
        binding=vdeco.get(_DEC_BINDING, [None])[0] if kind != "push_constant" else None,
        readonly=readonly,
        writeonly=writeonly,
    )


def reflect(code: bytes | bytearray | memoryview | str | Path) -> Reflection:
    """Read a SPIR-V module (bytes or a path) and return its blocks and work-group size."""
    if isinstance(code, (str, Path)):
        try:
            code = Path(code).read_bytes()
        except OSError as exc:
            raise ShaderError(f"cannot read SPIR-V file {str(code)!r}: {exc.strerror}") from None
    mod = _scan(_words(bytes(code)))
    if mod.entry is None:
        raise ShaderError("SPIR-V module has no entry point; compile it as a compute shader")
    push: Block | None = None
    bindings: dict[tuple[int, int], Block] = {}
    for ptr_type, var, storage in mod.variables:
        blk = _block(mod, ptr_type, var, storage)
        if blk is None:
            continue
        if blk.kind == "push_constant":
            push = blk
        else:
            key = (blk.set or 0, blk.binding if blk.binding is not None else 0)
            bindings[key] = blk
    spec_ids = {
        mod.names.get(tid, f"%{tid}"): d[_DEC_SPEC_ID][0]
        for tid, d in mod.decorations.items()
        if _DEC_SPEC_ID in d
    }
    return Reflection(
        entry_point=mod.entry[1],
        local_size=mod.local_size,
        local_size_spec_ids=_local_size_spec_ids(mod),
        push_constants=push,
        bindings=dict(sorted(bindings.items())),
        spec_ids=spec_ids,
    )


def _local_size_spec_ids(mod: _Module) -> tuple[int | None, int | None, int | None] | None:
    """Spec ids of the work-group size: from LocalSizeId, or a WorkgroupSize spec composite."""
    ids: list[int] | None = list(mod.local_size_ids) if mod.local_size_ids else None
    if ids is None:
        for cid, parts in mod.composites.items():
            if mod.decorations.get(cid, {}).get(_DEC_BUILTIN, [None])[0] == _BUILTIN_WORKGROUP_SIZE:
                ids = parts
    if ids is None:
        return None
    found = [mod.decorations.get(i, {}).get(_DEC_SPEC_ID, [None])[0] for i in ids[:3]]
    if all(f is None for f in found):
        return None
    return (found[0], found[1], found[2])
