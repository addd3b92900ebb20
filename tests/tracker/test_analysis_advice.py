"""The NaN hint fits the recorded GPU; runs record their GPUs without initialising CUDA."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracker
from tracker import hardware
from tracker.analysis import analyze
from tracker.analysis.advice import precision_hint
from tracker.spool import run_dir

AMP = {"amp": True, "imgsz": 640, "model": "yolo11n.pt", "data": "coco.yaml"}


def gpus(name: str, capability: str | None = None) -> dict[str, Any]:
    return {"gpus": [{"index": 0, "name": name, "capability": capability, "memory_bytes": None}]}


@pytest.mark.parametrize(
    ("name", "cap", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", "8.0", 8.0), ("NVIDIA GeForce RTX 3090", None, 8.6), ("Tesla T4", None, 7.5),
        ("NVIDIA GeForce GTX 1650", None, 7.5), ("Tesla V100-SXM2-16GB", None, 7.0),
        ("NVIDIA GeForce GTX 1080 Ti", None, 6.1), ("NVIDIA H200", "9.0", 9.0), ("Some Future Card", None, None),
    ],
)
def test_compute_capability_from_the_record_or_the_name(name: str, cap: str | None, expected: float | None) -> None:
    assert hardware.capability_of({"name": name, "capability": cap}) == expected


def test_the_hint_fits_the_card() -> None:
    gtx = precision_hint(AMP, gpus("NVIDIA GeForce GTX 1650"))
    assert "amp=False" in gtx and "float32" in gtx and "bfloat16" not in gtx.split(":")[1]
    a100 = precision_hint({"precision": "16-mixed"}, gpus("NVIDIA A100-SXM4-80GB", "8.0"))
    assert "supports bfloat16" in a100 and "bf16-mixed" in a100 and "amp=False" not in a100
    assert "set amp=False" in precision_hint(AMP, gpus("NVIDIA A100-SXM4-80GB", "8.0"))
    t4 = precision_hint({"dtype": "float16"}, gpus("Tesla T4", "7.5"))
    assert "has no bfloat16" in t4 and "float32" in t4 and "GradScaler" in t4
    unknown = precision_hint({"fp16": True}, {})
    assert "8.0+" in unknown and "GTX 16xx" in unknown
    assert "log(0)" in precision_hint({}, gpus("Tesla T4", "7.5"))  # a float32 run: not a precision problem
    imported = precision_hint({}, {"imported_from": {"kind": "ultralytics"}})
    assert imported.startswith("Ultralytics trains in float16 AMP") and "amp=False" in imported


def test_nvidia_smi_rows_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 0, "0, NVIDIA GeForce GTX 1650, 7.5, 4096\n1, Tesla T4, 7.5, 15360\n")

    monkeypatch.setattr(hardware.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(hardware.subprocess, "run", fake_run)
    monkeypatch.setattr(hardware, "_from_torch", lambda: None)
    found = hardware.gpu_inventory()
    assert found[0] == {"index": 0, "name": "NVIDIA GeForce GTX 1650", "capability": "7.5", "memory_bytes": 4 << 30}
    assert found[1]["name"] == "Tesla T4"
    monkeypatch.setattr(hardware.shutil, "which", lambda _: None)
    assert hardware.gpu_inventory() == []


def test_a_run_records_its_gpus_and_its_nan_hint_reads_them(home: Path) -> None:
    run = tracker.init("amp", config=AMP)
    loss = np.r_[np.linspace(3.0, 1.0, 30), [np.nan] * 5]
    for step, value in enumerate(loss):
        run.log({"train/loss": float(value)}, step=step)
    run.finish()
    meta_path = run_dir(home, run.run_id) / "run.json"
    meta = json.loads(meta_path.read_text())
    assert isinstance(meta["gpus"], list)
    meta["gpus"] = gpus("NVIDIA GeForce GTX 1660 SUPER")["gpus"]
    meta_path.write_text(json.dumps(meta))
    (nan,) = [r.event for r in analyze(run.run_id).findings if r.event.kind == "non_finite"]
    assert "GTX 1660 SUPER" in nan.message and "amp=False" in nan.data["advice"]
    (key,) = analyze(run.run_id).keys
    assert key.verdict == "diverging" and "amp=False" in (key.advice or "")
