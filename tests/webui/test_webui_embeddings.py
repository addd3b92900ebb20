"""The Embeddings page: its queries on a real store, and the page under AppTest (a collapsing and a healthy run)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import polars as pl
import pytest

import tracker
from tracker.embeddings import wait
from tracker.store import Store
from webui import embedding_charts
from webui.embedding_queries import embedding_keys, embedding_view

DIM = 32


def log_pair(home: Path | None = None, steps: int = 150) -> None:
    """Two runs of one embedding key ``proj``: ``collapsing`` falls to one point from step 50, ``healthy`` does not."""
    rng = np.random.default_rng(0)
    for name in ("collapsing", "healthy"):
        run = tracker.init("emb", name=name, run_id=name, system=False, home=home, loggers=["store"])
        for step in range(steps):
            f = min(1.0, max(0.0, (step - 50) / 30)) if name == "collapsing" else 0.0
            z = rng.normal(size=(128, DIM)) * (1 - f) + 2.0 * f + 1e-3 * rng.normal(size=(128, DIM))
            run.log({"train/loss": 1.0 / (1 + step)}, step=step)
            run.log_embeddings("proj", z.astype(np.float32), step=step, window=1024, every=256)
            assert wait(run)
        run.finish()


@pytest.fixture(scope="module")
def emb_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("embeddings") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKER_SYSTEM", "0")
        log_pair(home)
    yield home


@pytest.fixture
def home_env(emb_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRACKER_HOME", str(emb_home))
    return emb_home


def test_the_view_reads_keys_statistics_and_collapse_events(home_env: Path) -> None:
    view = embedding_view(Store(home_env), ["collapsing", "healthy"])
    assert view.keys.select("run_id", "key", "dim", "window").rows() == [("collapsing", "proj", DIM, 1024),
                                                                      ("healthy", "proj", DIM, 1024)]
    std = view.points.filter(pl.col("stat") == "std")
    healthy = std.filter(pl.col("run_id") == "healthy")
    assert healthy["y"].to_numpy() == pytest.approx(healthy["value"].to_numpy() * math.sqrt(DIM))
    assert healthy["y"].min() > 0.9  # ~1/sqrt(D) all along
    assert std.filter(pl.col("run_id") == "collapsing")["y"][-1] < 0.05
    assert set(view.points["stat"]) == {"std", "rankme", "dead_dims"}
    assert set(view.events["run_id"]) == {"collapsing"} and "std" in set(view.events["stat"])
    stored = tracker.query("SELECT step FROM events WHERE run_id = 'collapsing' AND key = 'proj/std'")
    assert view.events.filter(pl.col("stat") == "std")["step"].to_list() == stored["step"].to_list()
    lines, marks = embedding_charts.chart_frames(view.points, view.events, {"collapsing": "c", "healthy": "h"}, "std")
    assert set(lines["run"]) == {"c", "h"} and marks["run"].to_list() == ["c"]


def test_runs_without_embeddings_have_no_keys(home_env: Path) -> None:
    info = pl.DataFrame({"run_id": ["a", "b"], "config": ['{"lr": 1}', None]})
    assert embedding_keys(info).is_empty()
    view = embedding_view(Store(home_env), ["nope"])
    assert view.keys.is_empty() and view.points.is_empty() and view.events.is_empty()


def test_the_page_draws_the_three_statistics_with_the_collapse_marked(home_env: Path, app_page: Any,
                                                                      charts_of: Any) -> None:
    at = app_page("embeddings", run=["collapsing", "healthy"])
    assert [t.value for t in at.title] == ["Embeddings"]
    specs = charts_of(at)
    assert [s["title"]["text"] for s in specs] == ["std x sqrt(D)", "RankMe", "dead dimensions"]
    std_rows = specs[0]["_rows"]
    assert {r["run"] for r in std_rows if "y" in r and "run" in r} == {"collapsing", "healthy"}
    assert {r["y"] for r in std_rows if "what" in r} == {1.0, 0.3}  # the healthy level and the threshold
    marks = [r for r in std_rows if "message" in r]
    assert marks and all(r["run"] == "collapsing" and "What to do" in r["message"] for r in marks)
    assert [s.value for s in at.subheader] == ["Collapse events"]


def test_the_page_says_how_to_log_embeddings(home_env: Path, plain_run: str, app_page: Any) -> None:
    at = app_page("embeddings", run=[plain_run])
    assert any("run.log_embeddings" in i.value for i in at.info)
