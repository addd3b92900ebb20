"""tracker.system.preload_background_imports: what the run's threads would import during the
first training steps is imported on the calling thread, and ``import tracker.system`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys
import tracker.system as ts
light = not any(m in sys.modules for m in ("pyarrow", "pandas", "psutil", "torch"))
first = ts.preload_background_imports(True)
loaded = {m: m in sys.modules for m in ("pandas", "pyarrow.parquet", "pyarrow.compute", "psutil")}
again = ts.preload_background_imports(True)
print(json.dumps({"light": light, "loaded": loaded, "first": first, "again": again}))
"""


def test_preload_imports_what_the_background_threads_need_once() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["light"], "import tracker.system loaded a heavy module"
    assert out["loaded"] == {"pandas": True, "pyarrow.parquet": True, "pyarrow.compute": True, "psutil": True}
    assert out["first"] > 10 * out["again"]  # the second call finds everything imported


def test_preload_without_the_sampler_leaves_psutil_alone() -> None:
    child = "import sys, tracker.system as ts; ts.preload_background_imports(False); print('psutil' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
