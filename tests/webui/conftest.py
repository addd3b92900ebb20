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

Pages under AppTest: ``app_page`` (on whatever store ``TRACKER_HOME`` names) and
``open_page`` (on the seeded store); ``charts_of`` reads the charts they drew. In a real
browser: ``app_server`` serves a store, ``chromium`` opens headless Chromium (both from
:mod:`webui.browser`, which the screenshot scripts use too) and ``screenshot`` saves a
PNG to ``artifacts/`` (and ``docs/``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from contextlib import ExitStack
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import tracker
from tracker.errors import TrackerError
from webui.browser import launch_chromium, save_png, serve_app

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "webui" / "streamlit_app.py"
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
def plain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store of one run, ``plain``, with one ``loss`` value and nothing else, in a folder of its
    own that ``TRACKER_HOME`` now points at; its run id."""
    monkeypatch.setenv("TRACKER_HOME", str(tmp_path / "other"))
    run = tracker.init("p", system=False, run_id="plain")
    run.log({"loss": 1.0}, step=0)
    run.finish()
    return run.run_id


@pytest.fixture
def store(store_home: Path) -> Any:
    from tracker.store import Store

    return Store(store_home)


def open_app(page: str | None = None, **params: Any) -> Any:
    """Run the app under AppTest on the store ``TRACKER_HOME`` names: ``views/<page>.py`` (the
    router's own first page when ``page`` is None) with ``params`` as its query parameters. The
    run must raise no exception."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=60)
    for name, value in params.items():
        at.query_params[name] = value
    if page is not None:
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def app_page() -> Iterator[Callable[..., Any]]:
    """:func:`open_app` on whatever store ``TRACKER_HOME`` names; Streamlit's data cache is
    cleared before the test and after it."""
    import streamlit as st

    st.cache_data.clear()
    yield open_app
    st.cache_data.clear()


@pytest.fixture
def open_page(store_home: Path, app_page: Callable[..., Any]) -> Callable[..., Any]:
    """Open a page of the app on the seeded store: ``open_page("curves", run=[...], key="loss/total")``
    (``"runs"``, the default, is the router's first page)."""

    def _open(page: str = "runs", **params: Any) -> Any:
        return app_page(None if page == "runs" else page, **params)

    return _open


def chart_specs(at: Any) -> list[dict[str, Any]]:
    """The Vega-Lite specs the page drew, each with ``_data`` (its datasets as row dicts, by
    name), ``_rows`` (all those rows in one list) and ``_key`` (the chart's widget key)."""
    from streamlit import dataframe_util

    out = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        datasets = [(d.name, dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data).to_dict("records"))
                    for d in chart.proto.datasets]
        spec["_data"] = dict(datasets)
        spec["_rows"] = [row for _, rows in datasets for row in rows]
        spec["_key"] = chart.key
        out.append(spec)
    return out


@pytest.fixture
def charts_of() -> Callable[[Any], list[dict[str, Any]]]:
    return chart_specs


@pytest.fixture(scope="module")
def app_server() -> Iterator[Callable[[Path], str]]:
    """Serve the app on a store, as ``tracker ui`` does: ``url = app_server(home)``. The
    servers are stopped when the module's tests are done."""
    with ExitStack() as stack:
        yield lambda home: stack.enter_context(serve_app(home))


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Headless Chromium (:func:`webui.browser.launch_chromium`): ``context = chromium(width,
    height)``, a Playwright browser context closed when the module's tests are done. No
    Chromium fails the test, with how to install it."""
    with ExitStack() as stack:

        def launch(width: int = 1400, height: int = 1000) -> Any:
            profile = tmp_path_factory.mktemp("chromium-profile")
            try:
                return stack.enter_context(launch_chromium(profile, width=width, height=height))
            except TrackerError as error:
                pytest.fail(str(error))

        yield launch


def save_screenshot(page: Any, name: str, *, scale: float = 1.0, clip: dict[str, float] | None = None,
                    full_page: bool = False, docs: bool = True) -> Path:
    """Save ``artifacts/<name>``: a 256-colour PNG of ``page`` (or its ``clip``) scaled by
    ``scale``, the original beside it as ``<name>-full.png``; or, with ``full_page``,
    Playwright's own PNG of the whole page. It must hold more than 10 kB. With
    ``UPDATE_SCREENSHOT=1`` (and ``docs``) it is copied to ``docs/`` for the README."""
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / name
    if full_page:
        page.screenshot(path=str(shot), full_page=True)
    else:
        save_png(page, shot, scale=scale, clip=clip)
    assert shot.stat().st_size > 10_000
    if docs and os.environ.get("UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / name)
    return shot


@pytest.fixture(scope="session")
def screenshot() -> Callable[..., Path]:
    """:func:`save_screenshot`, for the browser tests."""
    return save_screenshot
