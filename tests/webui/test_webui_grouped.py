"""The curves page's grouped bands, logged-key x axis and fork lineage, and the runs
page's fork and aggregate columns, under AppTest on a store of two weighting schemes
over three seeds (and a fork)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import tracker

SCHEMES = {"ce": 2.0, "focal": 1.0}


def loss(scheme: str, seed: int, step: int) -> float:
    return SCHEMES[scheme] / (step + 1) + seed * 0.01


@pytest.fixture(scope="module")
def grouped_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("grouped") / "home"
    for scheme in SCHEMES:
        for seed in range(3):
            run = tracker.init("p", home=home, system=False, loggers=["store"], run_id=f"{scheme}{seed}",
                               name=f"{scheme}-s{seed}", config={"loss": {"scheme": scheme}, "seed": seed,
                                                                 "analysis": False})
            for step in range(40):
                run.log({"loss": loss(scheme, seed, step), "epoch": float(step // 10)}, step=step)
            run.finish()
    fork = tracker.init("p", home=home, system=False, loggers=["store"], run_id="ce0-fork", fork_from="ce0@19")
    for step in range(20, 30):
        fork.log({"loss": 0.5, "epoch": float(step // 10)}, step=step)
    fork.finish()
    return home


@pytest.fixture
def open_page(grouped_home: Path, monkeypatch: pytest.MonkeyPatch, app_page: Callable[..., Any]) -> Callable[..., Any]:
    """The conftest's ``app_page`` on this module's store."""
    monkeypatch.setenv("TRACKER_HOME", str(grouped_home))
    return app_page


def _rows(at: Any, caption: str) -> list[dict[str, Any]]:
    """The rows of the grouped chart (the one whose data has a ``group``); the page's caption
    must name ``caption`` (its band and x)."""
    from streamlit import dataframe_util

    assert any(caption in c.value for c in at.caption), [c.value for c in at.caption]
    for chart in at.get("vega_lite_chart"):
        rows = [row for d in chart.proto.datasets
                for row in dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data).to_dict("records")]
        if any("group" in r for r in rows):
            return rows
    raise AssertionError("no grouped chart")


RUNS = ["ce0", "ce1", "ce2", "focal0", "focal1", "focal2"]


def test_group_by_config_draws_each_groups_mean_and_band(open_page: Any) -> None:
    at = open_page("curves", run=RUNS, key="loss")
    picker = next(m for m in at.multiselect if m.label == "Group by config")
    assert picker.options == ["loss.scheme", "seed"]
    picker.set_value(["loss.scheme"]).run()
    assert not at.exception
    rows = _rows(at, "band: minmax · x: step")
    assert {r["group"] for r in rows if "mean" in r} == {"loss.scheme=ce (n=3)", "loss.scheme=focal (n=3)"}
    first = min((r for r in rows if r.get("group") == "loss.scheme=ce (n=3)"), key=lambda r: r["x"])
    assert first["mean"] == pytest.approx(sum(loss("ce", s, 0) for s in range(3)) / 3)
    assert first["lo"] == pytest.approx(loss("ce", 0, 0)) and first["hi"] == pytest.approx(loss("ce", 2, 0))
    next(r for r in at.radio if r.label == "Band").set_value("±std").run()
    rows = _rows(at, "band: std")
    first = min((r for r in rows if r.get("group") == "loss.scheme=ce (n=3)"), key=lambda r: r["x"])
    assert first["hi"] - first["mean"] == pytest.approx(0.01)  # the seeds' std
    table = at.dataframe[0].value.set_index("group")
    assert table.loc["loss.scheme=focal (n=3)", "runs"] == 3
    assert at.query_params["group"] in ("loss.scheme", ["loss.scheme"]) and at.query_params["band"] in ("std", ["std"])


def test_a_logged_key_as_x_aligns_runs(open_page: Any) -> None:
    at = open_page("curves", run=["ce0", "focal0"], key="loss")
    next(s for s in at.selectbox if s.label == "Align by (x)").set_value("epoch").run()
    assert not at.exception
    rows = _rows(at, "x: epoch")
    ce = sorted((r["x"], r["mean"]) for r in rows if r.get("group", "").startswith("ce-s0"))
    assert [x for x, _ in ce] == [0.0, 1.0, 2.0, 3.0]
    assert ce[0][1] == pytest.approx(sum(loss("ce", 0, s) for s in range(10)) / 10)


def test_forks_are_named_on_the_curves_page_and_in_the_runs_table(open_page: Any) -> None:
    at = open_page("curves", run=["ce0-fork", "ce0"], key="loss")
    assert any("`ce0-fork` from `ce0` at step 19" in c.value for c in at.caption)
    summary = at.dataframe[0].value.set_index("run")
    assert summary.loc["ce0-fork", "last step"] == 29
    from streamlit import dataframe_util

    rows = [row for chart in at.get("vega_lite_chart") for d in chart.proto.datasets
            for row in dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data).to_dict("records")]
    assert [(r["step"], r["reason"]) for r in rows if str(r.get("reason", "")).startswith("fork")] == [
        (20, "fork of ce0@19")]  # the fork's mark, where its own rows start
    at = open_page("runs")
    table = at.dataframe[0].value.set_index("run_id")
    assert table.loc["ce0-fork", "fork_of"] == "ce0@19" and not isinstance(table.loc["ce0", "fork_of"], str)
    assert table.loc["ce1", "best_step"] == 39
