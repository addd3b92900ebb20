"""A bulk reader of TensorBoard event files: TFRecord framing around ``Event`` protos.

A record is ``uint64 length | uint32 masked CRC-32C of the length | data | uint32
masked CRC-32C of the data``. Both checksums are verified, vectorised with numpy
(records of one length at once); a torn last record (a writer still running, or
killed) is ignored, as TensorBoard does; anything else that does not check out is a
:class:`~tracker.errors.DataError` naming the file, the record and its byte offset.

Scalar events written by PyTorch's, tensorboardX's and TF1's writers all share one
byte layout (wall time, step, one ``simple_value``); those are decoded with numpy
without building a protobuf object. Every other record goes through
``tensorboard.compat.proto.event_pb2``: ``simple_value`` values, and scalar tensors
of tags whose first metadata names the ``scalars`` plugin (TF2 and
``tensorboard.summary.Writer``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracker.errors import DataError

_MASK_DELTA = 0xA282EAD8


def _crc_table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _crc_table()
_TABLE_LIST = _TABLE.tolist()


def _masked(crc: np.ndarray) -> np.ndarray:
    crc = crc.astype(np.uint64)
    return ((((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF))


def masked_crc32c(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Masked CRC-32C of ``data[s:s+length]`` for every ``s`` in ``starts`` (vectorised)."""
    if len(starts) < 32:
        out = []
        for s in starts.tolist():
            c = 0xFFFFFFFF
            for b in data[s:s + length].tobytes():
                c = _TABLE_LIST[(c ^ b) & 0xFF] ^ (c >> 8)
            out.append(c ^ 0xFFFFFFFF)
        return _masked(np.asarray(out, np.uint32))
    crc = np.full(len(starts), 0xFFFFFFFF, np.uint32)
    for j in range(length):
        crc = _TABLE[(crc ^ data[starts + j]) & 0xFF] ^ (crc >> np.uint32(8))
    return _masked(crc ^ np.uint32(0xFFFFFFFF))


def frame(path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(data offsets, data lengths) of every complete record, checksums verified."""
    offsets: list[int] = []
    append = offsets.append
    unpack = struct.Struct("<Q").unpack_from
    pos, end = 0, len(data)
    limit = end - 12
    while pos <= limit:
        nxt = pos + 16 + unpack(data, pos)[0]
        if nxt > end:
            break  # a torn last record: a writer is still appending (or was killed)
        append(pos)
        pos = nxt
    heads = np.asarray(offsets, np.int64)
    buf = np.frombuffer(data, np.uint8)
    if not len(heads):
        return heads, heads
    lengths = _u64(buf, heads)
    bad_len = _u32(buf, heads + 8) != masked_crc32c(buf, heads, 8)
    if bad_len.any():
        _damaged(path, heads, int(np.argmax(bad_len)), "length checksum")
    starts = heads + 12
    stored = _u32(buf, starts + lengths.astype(np.int64))
    for length in np.unique(lengths).tolist():
        sel = np.flatnonzero(lengths == length)
        bad = stored[sel] != masked_crc32c(buf, starts[sel], int(length))
        if bad.any():
            _damaged(path, heads, int(sel[np.argmax(bad)]), "data checksum")
    return starts, lengths.astype(np.int64)


def _u64(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(buf[at[:, None] + np.arange(8)]).view("<u8").reshape(-1)


def _u32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(buf[at[:, None] + np.arange(4)]).view("<u4").reshape(-1).astype(np.uint64)


def _damaged(path: Path, heads: np.ndarray, i: int, what: str) -> None:
    raise DataError(
        f"TensorBoard event file {path} is damaged: record {i} (byte offset {int(heads[i])}) fails its "
        f"{what}. Remove the file, or truncate it to {int(heads[i])} bytes to import the records before it"
    )


@dataclass
class Scalars:
    """Scalar points of one event file, in file order."""

    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray
    key_codes: np.ndarray
    keys: list[str]


@dataclass
class TagKinds:
    """Per run: the plugin named by each tag's first metadata (TensorBoard keeps the first)."""

    plugin: dict[str, str] = field(default_factory=dict)


def _fast(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode records in the one-simple_value layout; returns (mask of decoded records, columns)."""
    pad = np.concatenate([buf, np.zeros(32, np.uint8)])
    n = len(starts)
    ok = pad[starts] == 0x09
    has_step = pad[starts + 9] == 0x10
    step = np.zeros(n, np.uint64)
    k = np.zeros(n, np.int64)  # bytes of the step field (tag + varint), 0 when the step is 0
    going = has_step.copy()
    for j in range(10):
        b = pad[starts + 10 + j]
        step |= np.where(going, (b & 0x7F).astype(np.uint64) << np.uint64(7 * j), np.uint64(0))
        k = np.where(going, j + 2, k)
        going &= b >= 0x80
    ok &= ~going
    p = starts + 9 + k
    t = pad[p + 5].astype(np.int64)
    ok &= (pad[p] == 0x2A) & (pad[p + 2] == 0x0A) & (pad[p + 4] == 0x0A) & (t < 119)
    ok &= (pad[p + 1] == t + 9) & (pad[p + 3] == t + 7) & (lengths == 20 + k + t)
    ok &= pad[np.minimum(p + 6 + t, len(pad) - 1)] == 0x15
    idx = np.flatnonzero(ok)
    s, p_ok, t_ok = starts[idx], p[idx], t[idx]
    walls = np.frombuffer(np.ascontiguousarray(pad[s[:, None] + np.arange(1, 9)]).tobytes(), "<f8")
    vals = np.frombuffer(np.ascontiguousarray(pad[(p_ok + 7 + t_ok)[:, None] + np.arange(4)]).tobytes(), "<f4")
    codes = np.zeros(len(idx), np.int64)
    keys: list[str] = []
    for length in np.unique(t_ok).tolist():
        sel = np.flatnonzero(t_ok == length)
        tag_bytes = np.ascontiguousarray(pad[(p_ok[sel] + 6)[:, None] + np.arange(length)])
        uniq, inverse = np.unique(tag_bytes.view(f"V{max(length, 1)}").reshape(-1), return_inverse=True)
        names = [u.tobytes()[:length].decode("utf-8", "replace") for u in uniq]
        codes[sel] = inverse.reshape(-1) + len(keys)
        keys.extend(names)
    cols = {"steps": step[idx].view(np.int64), "walls": walls, "values": vals.astype(np.float64),
            "codes": codes, "keys": keys}
    return ok, cols


def _tensor_scalar(tensor: Any) -> float | None:
    """The value of a one-element numeric TensorProto, else None."""
    if any(d.size != 1 for d in tensor.tensor_shape.dim):
        return None
    dtypes = {1: ("float_val", "<f4"), 2: ("double_val", "<f8"), 19: ("half_val", "<f2"),
              3: ("int_val", "<i4"), 9: ("int64_val", "<i8")}
    if tensor.dtype not in dtypes:
        return None
    field_name, code = dtypes[tensor.dtype]
    if tensor.tensor_content:
        arr = np.frombuffer(tensor.tensor_content, code)
        return float(arr[0]) if arr.size == 1 else None
    vals = getattr(tensor, field_name)
    if len(vals) != 1:
        return None
    if tensor.dtype == 19:
        return float(np.array([vals[0]], np.uint16).view(np.float16)[0])
    return float(vals[0])


def _slow(path: Path, data: bytes, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray,
          kinds: TagKinds) -> list[tuple[int, int, float, str, float]]:
    """Decode the records ``rows`` with protobuf: (record, step, wall time, tag, value)."""
    from tensorboard.compat.proto import event_pb2

    from_string = event_pb2.Event.FromString
    view = memoryview(data)
    out: list[tuple[int, int, float, str, float]] = []
    for r in rows.tolist():
        a = int(starts[r])
        try:
            ev = from_string(view[a:a + int(lengths[r])])
        except Exception as exc:
            raise DataError(f"TensorBoard event file {path}: record {r} (byte offset {a - 12}) is not an "
                            f"Event ({exc}); remove the file or import another logdir") from None
        if not ev.HasField("summary"):
            continue
        for v in ev.summary.value:
            if v.HasField("metadata") and v.metadata.plugin_data.plugin_name:
                kinds.plugin.setdefault(v.tag, v.metadata.plugin_data.plugin_name)
            which = v.WhichOneof("value")
            if which == "simple_value":
                out.append((r, ev.step, ev.wall_time, v.tag, v.simple_value))
            elif which == "tensor" and kinds.plugin.get(v.tag) == "scalars":
                x = _tensor_scalar(v.tensor)
                if x is not None:
                    out.append((r, ev.step, ev.wall_time, v.tag, x))
    return out


def read_scalars(path: Path, kinds: TagKinds) -> Scalars:
    """Every scalar point of one event file, in file order."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read TensorBoard event file {path}: {exc.strerror}") from None
    starts, lengths = frame(path, data)
    buf = np.frombuffer(data, np.uint8)
    ok, cols = _fast(buf, starts, lengths)
    slow = _slow(path, data, starts, lengths, np.flatnonzero(~ok), kinds)
    index = {k: i for i, k in enumerate(cols["keys"])}  # distinct: tags of different lengths
    slow_codes = np.asarray([index.setdefault(row[3], len(index)) for row in slow], np.int64)
    keys = list(index)
    rec = np.concatenate([np.flatnonzero(ok), np.asarray([row[0] for row in slow], np.int64)])
    order = np.argsort(rec, kind="stable")
    return Scalars(
        steps=np.concatenate([cols["steps"], np.asarray([row[1] for row in slow], np.int64)])[order],
        wall_times=np.concatenate([cols["walls"], np.asarray([row[2] for row in slow], np.float64)])[order],
        values=np.concatenate([cols["values"], np.asarray([row[4] for row in slow], np.float64)])[order],
        key_codes=np.concatenate([cols["codes"], slow_codes])[order],
        keys=keys,
    )
