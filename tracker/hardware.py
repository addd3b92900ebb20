"""The GPUs of this machine as a run records them, and what each card can compute in.

Rules:

* :func:`gpu_inventory` never initialises CUDA and never imports torch: it reads
  ``torch.cuda`` only when the program has imported torch *and* initialised CUDA
  itself, else asks ``nvidia-smi`` (2 s timeout) when it is on PATH, else records
  nothing. Each GPU is ``{"index", "name", "capability", "memory_bytes"}``
  (capability ``"8.6"`` or None).
* :func:`capability_of` gives a recorded GPU's compute capability, from the record
  or, for an older driver that cannot report it, from the card's name
  (:data:`CAPABILITY_BY_NAME`, the common NVIDIA cards).
* bfloat16 needs compute capability 8.0 (Ampere) or newer: A100, A10, L4, RTX 30xx
  and later have it; V100, T4, RTX 20xx, GTX 16xx, Pascal and older do not.
* :data:`AMP_NAN_CARDS` are the cards on which float16 autocast gives NaN losses or
  zero mAP; Ultralytics turns its AMP off on them (``ultralytics.utils.checks.check_amp``,
  ultralytics/ultralytics PR #17977).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from typing import Any, Mapping, Sequence

BF16_CAPABILITY = 8.0
AMP_NAN_CARDS = re.compile(
    r"(nvidia|geforce|quadro|tesla).*?(1660|1650|1630|t400|t550|t600|t1000|t1200|t2000|k40m)", re.IGNORECASE
)
# (pattern on the lower-cased card name, compute capability); the first match wins.
CAPABILITY_BY_NAME: tuple[tuple[str, float], ...] = (
    (r"\b(b100|b200|gb200|rtx 50\d\d|rtx pro \d{4} blackwell)\b", 10.0),
    (r"\b(h100|h200|h800|gh200)\b", 9.0),
    (r"\b(rtx 40\d\d|l4|l40s?|rtx \d{4} ada|rtx 6000 ada)\b", 8.9),
    (r"\b(rtx 30\d\d|a10g?|a40|a16|a2|rtx a\d{4}|a\d{4}\b)", 8.6),
    (r"\b(a100|a30|a800)\b", 8.0),
    (r"\b(gtx 16\d\d|rtx 20\d\d|titan rtx|t4|t\d{3,4}|quadro rtx \d{4})\b", 7.5),
    (r"\b(v100|titan v|quadro gv100)\b", 7.0),
    (r"\b(p100|quadro gp100)\b", 6.0),
    (r"\b(gtx 10\d\d|p40|p4|titan xp?|quadro p\d{3,4})\b", 6.1),
    (r"\b(gtx 9\d\d|m40|m60|titan x)\b", 5.2),
    (r"\b(k80)\b", 3.7),
    (r"\b(k40m?|k20)\b", 3.5),
)


def _from_torch() -> list[dict[str, Any]] | None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        out = []
        for i in range(cuda.device_count()):
            p = cuda.get_device_properties(i)
            out.append({"index": i, "name": str(p.name), "capability": f"{p.major}.{p.minor}",
                        "memory_bytes": int(p.total_memory)})
        return out
    except Exception:  # a broken CUDA install: record nothing rather than fail the run
        return None


def _from_nvidia_smi() -> list[dict[str, Any]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    fields = ("index", "name", "compute_cap", "memory.total")
    for query in (fields, fields[:2] + fields[3:]):  # drivers before 510 cannot report compute_cap
        try:
            done = subprocess.run(
                [exe, f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=2, check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return []
        if done.returncode == 0:
            return [_smi_row(line, "compute_cap" in query) for line in done.stdout.splitlines() if line.strip()]
    return []


def _smi_row(line: str, with_cap: bool) -> dict[str, Any]:
    parts = [p.strip() for p in line.split(",")]
    index, name = int(parts[0]), parts[1]
    cap = parts[2] if with_cap and parts[2] not in ("", "[N/A]") else None
    mib = parts[-1]
    return {"index": index, "name": name, "capability": cap,
            "memory_bytes": int(float(mib) * 2**20) if mib.replace(".", "", 1).isdigit() else None}


def gpu_inventory() -> list[dict[str, Any]]:
    """The GPUs of this machine (see the module doc); an empty list where there are none."""
    found = _from_torch()
    return found if found is not None else _from_nvidia_smi()


def capability_of(gpu: Mapping[str, Any]) -> float | None:
    """Compute capability of a recorded GPU: from its record, else from its name; None when unknown."""
    cap = gpu.get("capability")
    if cap not in (None, ""):
        try:
            return float(cap)
        except (TypeError, ValueError):
            pass
    name = str(gpu.get("name") or "").lower()
    for pattern, value in CAPABILITY_BY_NAME:
        if re.search(pattern, name):
            return value
    return None


def recorded_gpus(environment: Mapping[str, Any] | None) -> Sequence[Mapping[str, Any]]:
    """The GPUs a run recorded (``run.json``'s ``gpus``), or none."""
    gpus = (environment or {}).get("gpus")
    return [g for g in gpus if isinstance(g, Mapping)] if isinstance(gpus, list) else []
