"""webui.queries without Streamlit: runs table, SQL downsampling, resume handling, smoothing."""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tracker import schema
from tracker.errors import ConfigError
from webui import queries


def memory_curves(series: dict[str, tuple[np.ndarray, np.ndarray]]) -> duckdb.DuckDBPyConnection:
    """An in-memory store-like connection whose ``metrics`` hold ``series`` (run -> steps, values)."""
    con = duckdb.connect()
    steps = np.concatenate([np.asarray(s, np.int64) for s, _ in series.values()])
    values = np.concatenate([np.asarray(v, np.float64) for _, v in series.values()])
    runs = [run for run, (s, _) in series.items() for _ in range(len(s))]
    n = steps.size
    table = pa.table({
        "run_id": pa.array(runs, pa.string()), "rank": pa.array(np.zeros(n, np.int32)),
        "segment": pa.array(np.zeros(n, np.int32)), "step": pa.array(steps), "key": pa.array(["loss"] * n),
        "value": pa.array(values), "wall_time": pa.array(1000.0 + steps.astype(np.float64)),
    })
    con.register("_rows", table)
    con.execute("CREATE TABLE metrics AS SELECT * FROM _rows")
    con.execute("CREATE TABLE segments (run_id VARCHAR, rank INTEGER, segment INTEGER, start_step BIGINT)")
    for name, sql in schema.VIEWS_SQL.items():
        if name in ("segment_bounds", "curves", "hidden_metrics"):
            con.execute(f"CREATE VIEW {name} AS {sql}")
    return con


@settings(max_examples=40, deadline=None)
@given(
    n=hs.integers(1, 5000),
    buckets=hs.integers(2, 300),
    stride=hs.integers(1, 7),
    seed=hs.integers(0, 2**31 - 1),
)
def test_downsampling_keeps_band_mean_and_last_point(n: int, buckets: int, stride: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = np.arange(n) * stride + int(rng.integers(0, 100))
    values = rng.normal(size=n).cumsum()
    con = memory_curves({"a": (steps, values)})
    out = queries.curve(con, ["a"], "loss", buckets=buckets)
    body, last = out.filter(~pl.col("last")), out.filter(pl.col("last"))
    assert body.height <= buckets
    assert body["n"].sum() == n
    assert last.height == 1 and last["step"][0] == steps[-1] and last["mean"][0] == pytest.approx(values[-1])
    assert body["lo"].min() == pytest.approx(values.min()) and body["hi"].max() == pytest.approx(values.max())
    assert bool(body["raw"].all()) == (n <= buckets)
    for row in body.sample(min(body.height, 5), seed=seed).iter_rows(named=True):
        inside = (steps >= row["step"]) & (steps <= row["step_end"])
        assert inside.sum() == row["n"]
        assert row["mean"] == pytest.approx(values[inside].mean())
        assert row["lo"] == pytest.approx(values[inside].min()) and row["hi"] == pytest.approx(values[inside].max())
    assert body["step"].is_sorted()


def test_zoom_requeries_at_full_detail() -> None:
    steps = np.arange(100_000)
    con = memory_curves({"a": (steps, np.sin(steps / 1000.0))})
    full = queries.curve(con, ["a"], "loss", buckets=1000)
    assert not full["raw"].any() and full.filter(~pl.col("last")).height == 1000
    zoom = queries.curve(con, ["a"], "loss", lo=5000, hi=5999, buckets=1000)
    body = zoom.filter(~pl.col("last"))
    assert zoom["raw"].all()
    assert body["step"].to_list() == list(range(5000, 6000))
    np.testing.assert_allclose(body["mean"].to_numpy(), np.sin(np.arange(5000, 6000) / 1000.0))
    assert zoom.filter(pl.col("last"))["step"][0] == 5999


def test_nonfinite_values_are_counted_not_averaged() -> None:
    values = np.array([1.0, np.nan, 3.0, np.inf, 5.0, 6.0])
    con = memory_curves({"a": (np.arange(6), values)})
    out = queries.curve(con, ["a"], "loss", buckets=2)
    body = out.filter(~pl.col("last")).sort("step")
    assert body["nonfinite"].to_list() == [1, 1]
    assert body["mean"].to_list() == [pytest.approx(2.0), pytest.approx(5.5)]
    assert out.filter(pl.col("last"))["mean"][0] == 6.0


def test_each_run_is_bucketed_over_its_own_range() -> None:
    con = memory_curves({
        "short": (np.arange(10), np.ones(10)),
        "long": (np.arange(0, 50_000, 5), np.linspace(1, 0, 10_000)),
    })
    out = queries.curve(con, ["short", "long"], "loss", buckets=100)
    by_run = {r: out.filter((pl.col("run_id") == r) & ~pl.col("last")) for r in ("short", "long")}
    assert by_run["short"]["raw"].all() and by_run["short"].height == 10
    assert not by_run["long"]["raw"].any() and by_run["long"].height == 100


def test_bucket_budget_is_checked() -> None:
    con = memory_curves({"a": (np.arange(3), np.ones(3))})
    with pytest.raises(ConfigError, match="buckets 5000"):
        queries.curve(con, ["a"], "loss", buckets=5000)
    with pytest.raises(ConfigError, match="empty"):
        queries.curve(con, ["a"], "loss", lo=10, hi=5)


def tensorboard_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing, written out as its frontend does it."""
    last, n, out = 0.0, 0, []
    for v in values:
        n += 1
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**n))
    return out


def test_smoothing_is_tensorboards_debiased_ema() -> None:
    frame = pl.DataFrame({"run_id": ["a"] * 50 + ["b"] * 30, "rank": [0] * 80,
                          "mean": list(np.linspace(3, 1, 50)) + list(np.cos(np.arange(30)))})
    out = queries.smooth(frame, 0.8)
    for run, part in out.group_by("run_id"):
        expected = tensorboard_ema(part["mean"].to_list(), 0.8)
        np.testing.assert_allclose(part["smooth"].to_numpy(), expected, rtol=1e-12)
    assert queries.smooth(frame, 0.0)["smooth"].to_list() == frame["mean"].to_list()


def test_runs_table_summary_and_loss(store, seeded) -> None:
    runs = queries.runs_table(store, sort="name", descending=False)
    assert runs["run_id"].to_list() == ["run-bce", "run-detr", "run-w"]
    row = {r["run_id"]: r for r in runs.iter_rows(named=True)}
    assert row["run-bce"]["status"] == "finished" and row["run-detr"]["status"] == "crashed"
    assert row["run-bce"]["loss_key"] == "loss/total" and row["run-detr"]["loss_key"] == "loss"
    assert row["run-bce"]["best_loss"] == pytest.approx(seeded.bce_total(299))
    assert row["run-bce"]["last_loss"] == pytest.approx(seeded.bce_total(299))
    assert row["run-bce"]["max_loss"] == pytest.approx(max(seeded.bce_total(s) for s in range(300)))
    assert row["run-w"]["best_loss"] == pytest.approx(seeded.w_total(259, 1))
    assert math.isnan(row["run-w"]["last_loss"])
    assert row["run-w"]["status"] == "finished" and row["run-w"]["segments"] == 2 and row["run-w"]["last_step"] == 260
    assert row["run-detr"]["last_loss"] == pytest.approx(3.0 - 49 / 50)


@pytest.mark.parametrize(
    "filters, expected",
    [
        ({"projects": ["detr"]}, {"run-detr"}),
        ({"statuses": ["finished"]}, {"run-bce", "run-w"}),
        ({"tags": ["rfs"]}, {"run-w"}),
        ({"tags": ["baseline"], "projects": ["yolo"]}, {"run-bce"}),
        ({"text": "CW-BCE"}, {"run-w"}),
        ({"text": "detr-sm"}, {"run-detr"}),
        ({"text": "no such thing"}, set()),
    ],
)
def test_runs_table_filters(store, filters: dict, expected: set) -> None:
    assert set(queries.runs_table(store, **filters)["run_id"]) == expected


def test_runs_table_sort_and_loss_key(store) -> None:
    by_best = queries.runs_table(store, sort="best_loss", descending=False)
    assert by_best["run_id"].to_list()[0] == "run-bce"
    box = queries.runs_table(store, loss_key="loss/box")
    assert dict(zip(box["run_id"], box["best_loss"]))["run-w"] == pytest.approx(0.4)
    with pytest.raises(ConfigError, match="Unknown sort column 'speed'"):
        queries.runs_table(store, sort="speed")


def test_config_columns_spread_scalars(store) -> None:
    runs = queries.config_columns(queries.runs_table(store, sort="name", descending=False))
    assert runs["config.lr"].to_list() == [0.01, 0.001, 0.02]
    assert runs["config.model.depth"].to_list() == [None, 6, None]
    assert runs["config.class_counts"].to_list() == ["[262465, 7113, 43867, 198]", None,
                                                     "[262465, 7113, 43867, 198]"]
    assert json.loads(runs["config"][2])["class_weights"] == [0.2, 1.0, 0.5, 3.0]


def test_config_columns_keep_vectors_in_one_summarised_column() -> None:
    names = [f"class{i}" for i in range(80)]
    config = {"lr": 0.1, "class_counts": {n: i + 1 for i, n in enumerate(names)},
              "loss": {"scheme": "effective_number", "counts": list(range(80, 0, -1))},
              "aug": {"flip": 0.5, "hsv": [0.1, 0.2]}, "tags": ["a", "b"] * 10}
    runs = pl.DataFrame({"run_id": ["r"], "config": [json.dumps(config)]})
    out = queries.config_columns(runs)
    shown = {c: out[c][0] for c in out.columns if c.startswith("config.")}
    assert shown == {
        "config.lr": 0.1, "config.class_counts": "80 values, 1 … 80", "config.loss.scheme": "effective_number",
        "config.loss.counts": "80 values, 1 … 80", "config.aug.flip": 0.5, "config.aug.hsv": "[0.1, 0.2]",
        "config.tags": "20 items",
    }


def test_resumed_curve_has_no_duplicate_and_no_gap(store, seeded) -> None:
    out = queries.curve(store, ["run-w"], "loss/total", buckets=2000)
    body = out.filter(~pl.col("last"))
    assert body["step"].to_list() == list(range(261))
    values = dict(zip(body["step"], body["mean"]))
    assert values[149] == pytest.approx(seeded.w_total(149, 0)) and values[150] == pytest.approx(seeded.w_total(150, 1))
    assert body.filter(pl.col("step") == 260)["nonfinite"][0] == 1
    hidden = queries.hidden_curve(store, ["run-w"], "loss/total").filter(~pl.col("last"))
    assert hidden["step"].to_list() == list(range(150, 200)) and set(hidden["segment"]) == {0}
    assert hidden["mean"][0] == pytest.approx(seeded.w_total(150, 0))
    marks = queries.resume_marks(store, ["run-w"])
    assert marks.select("segment", "step", "reason").rows() == [(0, 0, "start"), (1, 150, "resume")]


def test_keys_bounds_labels_and_events(store) -> None:
    keys = queries.metric_keys(store, ["run-bce", "run-detr"])
    assert keys.rows() == [("loss", 1, 50), ("loss/box", 1, 300), ("loss/total", 1, 300)]
    bounds = queries.step_bounds(store, ["run-bce", "run-w"], "loss/total")
    assert bounds.select("run_id", "lo", "hi", "n").rows() == [("run-bce", 0, 299, 300), ("run-w", 0, 260, 261)]
    info = queries.run_info(store, ["run-w", "run-bce"])
    assert info["run_id"].to_list() == ["run-w", "run-bce"]
    assert queries.run_labels(info) == {"run-w": "weighted", "run-bce": "bce"}
    events = queries.events_table(store)
    assert events.select("run_id", "step", "kind", "severity").rows() == [
        ("run-bce", 150, "spike", "warning"), ("run-w", 120, "divergence", "warning"), ("run-w", 260, "nan", "error")]
    assert queries.events_table(store, severities=["error"])["run_id"].to_list() == ["run-w"]


def test_schema_lists_every_table_and_view(store) -> None:
    schema = queries.schema_info(store)
    assert set(schema["table"]) == {"runs", "segments", "metrics", "class_metrics", "classes", "events",
                                    "curves", "class_curves", "hidden_metrics", "segment_bounds", "run_summary",
                                    "run_aggregates", "run_lineage"}
    assert schema.filter(pl.col("table") == "metrics")["column"].to_list() == [
        "run_id", "rank", "segment", "step", "key", "value", "wall_time"]


def test_live_run_is_seen_before_ingestion(store) -> None:
    import tracker

    run = tracker.init("yolo", name="live", run_id="run-live", home=store.home, loggers=["store"])
    try:
        for s in range(40):
            run.log({"loss/total": 1.0 / (s + 1)}, step=s)
        run.flush()
        assert queries.running(store, ["run-live"]) and not queries.running(store, ["run-bce"])
        out = queries.curve(store, ["run-live"], "loss/total")
        assert out.filter(pl.col("last"))["step"][0] == 39
    finally:
        run.finish()
    assert not queries.running(store, ["run-live"])


def test_queries_hold_no_connection(store) -> None:
    queries.runs_table(store)
    queries.curve(store, ["run-w"], "loss/total")
    with store.connect(write=True, timeout=0.0) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
