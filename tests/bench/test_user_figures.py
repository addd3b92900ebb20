"""bench/losses.py, the cold reads of bench/logging.py and bench/coco.py's report, on tiny inputs."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_losses_bench_sets_threads_and_times_both_buffers_and_the_integration() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.losses", "--batch", "1", "--anchors", "128", "--repeat", "1",
                          "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "threads: torch 1 (torch.set_num_threads), our numpy kernels 1 (TRACKER_NUM_THREADS)" in out
    grad_diff = float(re.search(r"gradient max abs diff (\S+)", out).group(1))
    assert grad_diff < 1e-6  # the same work: our numpy gradient is torch's
    ms = r"\s+[\d.]+ \(\s*[\d.]+\)"
    assert re.search(rf"torch BCE-with-logits{ms}{ms}{ms}", out)  # forward, fresh, reused
    assert re.search(rf"class_weighted_bce numpy{ms}{ms}{ms}\s+[\d.]+x \([\d.]+x\) / [\d.]+x", out)
    for row in ("stock BCEWithLogitsLoss + per-class tracking", "class_weighted_bce, built-in (tracker.torch ops)",
                "HostTermFunction bridge, auto -> "):
        assert re.search(re.escape(row) + r".*ms\s+vs stock [\d.]+x", out), row


@pytest.fixture
def bench_logging() -> object:
    path = list(sys.path)
    try:
        yield importlib.import_module("bench.logging")  # it trims sys.path at import: give it back
    finally:
        sys.path[:] = path


def test_cold_reads_time_the_query_after_imports_and_a_whole_interpreter(
        bench_logging: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracker
    from tracker.store import release

    run = tracker.init("p", run_id="r", home=tmp_path, loggers=["store"], system=False, config={"analysis": False})
    for i in range(50):
        run.log({"k": float(i)}, step=i)
    run.finish()
    release()
    sql = "SELECT step, value FROM curves WHERE key = 'k' ORDER BY step"
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    first, whole, cli = bench_logging.cold_reads(tmp_path, sql, rounds=1)  # type: ignore[attr-defined]
    assert len(first) == len(whole) == len(cli) == 1
    # the whole interpreter pays its start and imports on top of the query
    assert 0 < first[0] < whole[0]


def test_the_coco_report_names_both_comparisons(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from bench import coco

    src = tmp_path / "in.json"
    src.write_bytes(b"{}" * 1000)
    m = coco.Measure
    results = {"tracker coco stats": [m(1.0, 1.0, 100.0, True)],
               "pycocotools COCO(path) load": [m(8.0, 8.0, 400.0, True)],
               "faster-coco-eval COCO(path) load": [m(6.0, 6.0, 300.0, True)],
               coco.KEEP: [m(4.0, 4.0, 350.0, True)]}
    coco.report("train2017 scale", src, results)
    out = capsys.readouterr().out
    assert "stats (polygons skipped while parsing, the peers parse them):" in out
    assert "like for like, load keeping polygons (every polygon parsed on both sides):" in out
    like = out.split("like for like")[1]
    assert re.search(r"vs pycocotools:\s+2\.00 \(2\.00-2\.00\)x faster; peak RSS 0\.88x theirs", like)
    assert re.search(r"vs faster-coco-eval:\s+1\.50 \(1\.50-1\.50\)x faster", like)
