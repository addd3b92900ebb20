"""The example plugin package of docs/plugins.md, installed with pip as a user would.

It goes into a throwaway ``--target`` folder (never the suite's environment, whose
plugin list every other test relies on); then ``tracker plugins``, ``tracker
check-plugins`` and the package's own tests run against that installation. A copy
with the gradient-overwrite bug must fail ``check-plugins``: the gate works.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tracker-example-plugin"

pytestmark = pytest.mark.slow


def _install(tmp_path: Path, name: str, broken: bool = False) -> dict[str, str]:
    """Copy the example, pip-install the copy into its own folder; the environment that sees it."""
    source = tmp_path / f"{name}-src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    if broken:
        kernel = source / "src" / "tracker_example" / "poly1.py"
        text = kernel.read_text()
        assert "grad += gradient" in text
        kernel.write_text(text.replace("grad += gradient", "grad[...] = gradient"))
    site = tmp_path / f"{name}-site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (site / "tracker_example_plugin-0.1.0.dist-info" / "entry_points.txt").exists()
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "TRACKER_HOME": str(tmp_path / f"{name}-home"),
            "SOURCE": str(source)}


def _tracker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracker.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _install(tmp_path_factory.mktemp("example"), "example")


def test_tracker_plugins_lists_what_the_example_registered(installed: dict[str, str]) -> None:
    res = _tracker(installed, "plugins", "--format", "json")
    assert res.returncode == 0, res.stderr
    row = {r["name"]: r for r in json.loads(res.stdout)}["example"]
    assert row["version"] == "0.1.0" and row["status"] is None
    assert row["registered"] == {
        "losses": ["poly1_bce"], "kernels": ["poly1_bce/numpy"], "samplers": ["shuffled"],
        "loggers": ["jsonl"], "detectors": ["loss_ceiling"], "panels": ["example"],
    }


def test_check_plugins_passes_the_example(installed: dict[str, str]) -> None:
    res = _tracker(installed, "check-plugins")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split("\t") for line in res.stdout.splitlines()]
    assert ["poly1_bce", "reference", "example", "9", "ok"] in rows
    assert ["poly1_bce", "numpy", "example", "9", "ok"] in rows


def test_the_example_packages_own_tests_pass(installed: dict[str, str]) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=installed["SOURCE"], env=installed,
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(\d+) passed in [\d.]+s( \([\d:]+\))?", summary), summary
    assert int(summary.split()[0]) >= 7  # its own tests plus a conformance test per registered term and kernel


def test_check_plugins_fails_the_example_with_an_overwriting_kernel(tmp_path: Path) -> None:
    env = _install(tmp_path, "broken", broken=True)
    res = _tracker(env, "check-plugins", "--term", "poly1_bce")
    assert res.returncode == 1
    assert "poly1_bce/numpy (plugin 'example'): check 'accumulation' failed" in res.stdout
    assert "OVERWROTE the gradient instead of adding into it" in res.stdout
