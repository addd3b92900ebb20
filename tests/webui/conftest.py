"""Fixtures for the web UI tests: a seeded store copied into each test's own folder.

The seeded store holds (all values follow closed formulas the tests recompute):

* ``run-bce`` (project ``yolo``, name ``bce``, finished, tag ``baseline``): ``loss/total``
  and ``loss/box`` at steps 0..299, per-class ``loss/cls`` every 10 steps, one event;
* ``run-w`` (project ``yolo``, name ``weighted``, tags ``weighted``/``rfs``, class
  weights in its config): steps 0..199, killed, resumed at step 150 up to step 259,
  a NaN at step 260 and an error event there;
* ``run-detr`` (project ``detr``, crashed, no per-class values).

``coco_run`` adds ``run-coco`` to a test's copy: COCO's 80 classes, trained (on
paper) with class-weighted BCE the way the demo records it: the loss section of the
config holds ``scheme``, ``beta`` and the 80 ``counts``, and no weight vector.
"""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import tracker

APP = Path(__file__).resolve().parents[2] / "webui" / "streamlit_app.py"
CLASSES = ["person", "bicycle", "car", "hair drier"]
COUNTS = [262465, 7113, 43867, 198]
WEIGHTS = [0.2, 1.0, 0.5, 3.0]


def bce_total(step: int) -> float:
    return 2.0 * math.exp(-step / 80) + 0.1


def w_total(step: int, segment: int) -> float:
    return (1.5 if segment == 0 else 1.2) * math.exp(-step / 60) + 0.2


def bce_classes(step: int) -> list[float]:
    return [0.1, 0.5, 0.2, 1.0 + step / 300]


def w_classes(step: int) -> list[float]:
    return [0.2, 0.3, 0.2, 0.6 + step / 1000]


def seed(home: Path) -> None:
    """Write the seeded store described in the module doc under ``home``."""
    common = {"home": home, "loggers": ["store"]}
    quiet = {"analysis": False}  # the online detectors stay out: the events below are the whole set
    run = tracker.init("yolo", name="bce", run_id="run-bce", tags=["baseline"],
                       config={"lr": 0.01, "loss": "bce", "class_counts": COUNTS, **quiet}, **common)
    run.set_classes(CLASSES)
    for s in range(300):
        run.log({"loss/total": bce_total(s), "loss/box": 0.5}, step=s)
        if s % 10 == 0:
            run.log_classes("loss/cls", bce_classes(s), step=s)
    run.event("spike", "loss spiked", step=150, key="loss/total")
    run.finish()
    config = {"lr": 0.02, "loss": "cw-bce", "class_counts": COUNTS, "class_weights": WEIGHTS, **quiet}
    run = tracker.init("yolo", name="weighted", run_id="run-w", tags=["weighted", "rfs"], config=config, **common)
    run.set_classes(CLASSES)
    for s in range(200):
        run.log({"loss/total": w_total(s, 0), "loss/box": 0.4}, step=s)
        if s % 10 == 0:
            run.log_classes("loss/cls", w_classes(s), step=s)
    run.finish("killed")
    run = tracker.init("yolo", run_id="run-w", resume="allow", resume_step=150, **common)
    for s in range(150, 260):
        run.log({"loss/total": w_total(s, 1), "loss/box": 0.4}, step=s)
    run.log({"loss/total": float("nan")}, step=260)
    run.event("nan", "loss/total is NaN", step=260, key="loss/total", severity="error")
    run.finish()
    run = tracker.init("detr", name="detr-small", run_id="run-detr", tags=["baseline"],
                       config={"lr": 0.001, "model": {"depth": 6}, **quiet}, **common)
    for s in range(50):
        run.log({"loss": 3.0 - s / 50}, step=s)
    run.finish("crashed")
    from tracker.events import Event
    from tracker.store import Store

    finding = Event(step=120, kind="divergence", message="loss/total rose 3 sigma", key="loss/total",
                    severity="warning", data={"z": 3.2})
    Store(home).add_events("run-w", [finding], segment=0)


def coco_counts() -> tuple[list[str], list[int]]:
    """COCO train2017's 80 class names and instance counts, as shipped with the package."""
    from importlib import resources

    from tracker.weights import load_counts

    with resources.as_file(resources.files("tracker.data") / "coco_train2017_class_counts.json") as path:
        loaded = load_counts(path)
    return loaded.names, [int(c) for c in loaded.counts]


def coco_class_loss(step: int, index: int, count: int) -> float:
    """Per-class loss of ``run-coco``: rarer classes start higher and fall slower."""
    return (0.2 + 2.0 / math.log10(count + 10)) * math.exp(-step / (300 + index * 10)) + 0.01 * index / 80


def seed_coco(home: Path, steps: int = 300) -> None:
    """``run-coco`` (see module doc) under ``home``, with a resume at 2/3 of ``steps``."""
    names, counts = coco_counts()
    config = {"model": "yolo11n", "class_counts": dict(zip(names, counts)),
              "loss": {"scheme": "effective_number", "beta": 0.999, "counts": counts}, "analysis": False}
    common = {"home": home, "loggers": ["store"]}
    stop = steps * 2 // 3
    run = tracker.init("coco", name="coco-80", run_id="run-coco", config=config, **common)
    run.set_classes(names)
    for s in range(stop):
        run.log({"loss/total": 3.0 * math.exp(-s / 120) + 0.5}, step=s)
        if s % 10 == 0:
            run.log_classes("loss/cls", [coco_class_loss(s, i, c) for i, c in enumerate(counts)], step=s)
    run.finish("killed")
    resume = stop - stop % 50
    run = tracker.init("coco", run_id="run-coco", resume="allow", resume_step=resume, **common)
    for s in range(resume, steps):
        run.log({"loss/total": 2.8 * math.exp(-s / 120) + 0.5}, step=s)
        if s % 10 == 0:
            run.log_classes("loss/cls", [coco_class_loss(s, i, c) for i, c in enumerate(counts)], step=s)
    run.finish()


@pytest.fixture(scope="session")
def seeders() -> SimpleNamespace:
    """The seeding functions, for fixtures that build their own stores (``coco``: :func:`seed_coco`)."""
    return SimpleNamespace(coco=seed_coco)


@pytest.fixture
def coco_run(store_home: Path) -> SimpleNamespace:
    """``run-coco`` added to this test's store; its class names and counts."""
    seed_coco(store_home)
    names, counts = coco_counts()
    return SimpleNamespace(run_id="run-coco", names=names, counts=counts)


@pytest.fixture(scope="session")
def seeded() -> SimpleNamespace:
    """The seeded store's class names, counts, weights and value formulas."""
    return SimpleNamespace(classes=CLASSES, counts=COUNTS, weights=WEIGHTS, bce_total=bce_total,
                           w_total=w_total, bce_classes=bce_classes, w_classes=w_classes)


@pytest.fixture(scope="session")
def seeded_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("seeded") / "home"
    seed(home)
    return home


@pytest.fixture
def store_home(seeded_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the seeded store; TRACKER_HOME points at it."""
    home = tmp_path / "home"
    shutil.copytree(seeded_template, home)
    monkeypatch.setenv("TRACKER_HOME", str(home))
    monkeypatch.setenv("TRACKER_LOGGERS", "store")
    return home


@pytest.fixture
def store(store_home: Path) -> Any:
    from tracker.store import Store

    return Store(store_home)


@pytest.fixture
def open_page(store_home: Path) -> Iterator[Callable[..., Any]]:
    """Open a page of the app with AppTest: ``open_page("curves", run=[...], key="loss/total")``."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()

    def _open(page: str = "runs", **params: Any) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=60)
        for name, value in params.items():
            at.query_params[name] = value
        if page != "runs":
            at.switch_page(f"views/{page}.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    yield _open
    st.cache_data.clear()


def chart_specs(at: Any) -> list[dict[str, Any]]:
    """The Vega-Lite specs the page drew, each with ``_data``: its datasets as row dicts."""
    from streamlit import dataframe_util

    out = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        spec["_data"] = {
            d.name: dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data).to_dict("records")
            for d in chart.proto.datasets
        }
        spec["_key"] = chart.key
        out.append(spec)
    return out


@pytest.fixture
def charts_of() -> Callable[[Any], list[dict[str, Any]]]:
    return chart_specs
