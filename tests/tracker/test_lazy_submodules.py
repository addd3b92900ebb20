"""``import tracker`` then any submodule as an attribute, without importing it first, and cheaply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import json, sys
before = set(sys.modules)
import tracker
loaded = sorted(set(sys.modules) - before)
heavy = ("torch", "duckdb", "polars", "numpy")
out = {"loaded_by_import": [m for m in loaded if m.startswith("tracker") or m in heavy]}
tracker.store.release()                                   # docs/store.md: close the idle reader
out["torch_before_access"] = "torch" in sys.modules
out["bce"] = tracker.torch.ClassWeightedBCEWithLogits.__name__
out["weights"] = [round(w, 6) for w in tracker.weights.class_weights([10, 1000], "inverse").tolist()]
out["in_dir"] = [n for n in ("store", "torch", "weights", "init") if n in dir(tracker)]
try:
    tracker.no_such_thing
except AttributeError as exc:
    out["missing"] = str(exc)
print(json.dumps(out))
"""


def test_readme_spellings_work_without_importing_the_submodules_first() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # import tracker stays light: no submodule with a heavy dependency is imported up front
    assert out["loaded_by_import"] == ["tracker", "tracker.errors", "tracker.hookspecs"]
    assert out["torch_before_access"] is False
    assert out["bce"] == "ClassWeightedBCEWithLogits"
    assert out["weights"] == [1.980198, 0.019802]
    assert out["in_dir"] == ["store", "torch", "weights", "init"]
    assert out["missing"] == "module 'tracker' has no attribute 'no_such_thing'"


def _blas_timeout(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    proc = subprocess.run([sys.executable, "-c", code + "\nimport os; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"],
                          env={**base, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1]


def test_import_tracker_lets_openblas_threads_sleep_unless_told_otherwise() -> None:
    # imported before numpy: OpenBLAS's idle threads sleep at once instead of spinning for ~0.1 s
    assert _blas_timeout("import tracker, numpy") == "4"
    # a value the user set is kept
    assert _blas_timeout("import tracker", OPENBLAS_THREAD_TIMEOUT="20") == "20"
    # numpy already loaded: the variable would do nothing, so the environment is left alone
    assert _blas_timeout("import numpy, tracker") == "None"
