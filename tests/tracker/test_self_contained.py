"""A clone carries everything its tests read: no path to a sibling folder or a machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a path to a sibling folder (dot-dot, or parents[N] then the folder's name) or an absolute machine path
OUTSIDE = re.compile(
    r"\.\./shared|parents\[\d\]\s*/\s*[\"']shared|[\"']/work/|[\"']/home/[a-z]"
)


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p]


def test_no_tracked_file_reads_outside_the_repository() -> None:
    files = [p for p in _tracked() if p.suffix in {".py", ".toml", ".sh", ".cfg", ".yml", ".yaml"}
             or p.name in {"Makefile", "run"}]
    assert files, "git ls-files found nothing to check"
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        if p.exists() and p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert hits == [], "files that read outside the clone:\n" + "\n".join(hits)


def test_the_coco_test_data_is_in_the_repository_with_its_attribution() -> None:
    data = ROOT / "tests" / "data" / "coco"
    assert (data / "instances_val2014_100.json").stat().st_size > 100_000
    assert (data / "train2017_class_counts.json").exists()
    readme = (data / "README.md").read_text()
    assert "Creative Commons Attribution 4.0" in readme
