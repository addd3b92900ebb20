"""Every page of the app under streamlit.testing.v1.AppTest, on the seeded store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import pytest

COCO_100 = str(Path(__file__).resolve().parents[1] / "data" / "coco" / "instances_val2014_100.json")


def layer_marks(spec: dict[str, Any]) -> list[str]:
    marks = []
    for layer in spec.get("layer", []):
        if "layer" in layer:
            marks.extend(layer_marks(layer))
        else:
            mark = layer.get("mark")
            marks.append(mark if isinstance(mark, str) else mark.get("type"))
    return marks


def all_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for rows in spec["_data"].values() for row in rows]


def all_marks(spec: dict[str, Any]) -> list[str]:
    marks = layer_marks(spec)
    for part in spec.get("hconcat", []):
        marks.extend(all_marks(part))
    mark = spec.get("mark")
    if mark is not None:
        marks.append(mark if isinstance(mark, str) else mark.get("type"))
    return marks


# Charts drawn without a selection carry no key: they are told apart by their marks.
CHART_MARKS = {
    "curves.chart": None,
    "events.chart": "area",
    "classes.heatmap": "rect",
    "classes.ranking": "bar",
    "classes.share": "area",
    "classes.rare": "circle",
}


def chart(charts_of: Any, at: Any, key: str) -> dict[str, Any]:
    specs = charts_of(at)
    mark = CHART_MARKS[key]
    if mark is None:
        found = [c for c in specs if (c["_key"] or "").startswith(key)]
    else:
        found = [c for c in specs if mark in all_marks(c)]
    assert found, f"no chart {key!r}; charts: {[all_marks(c) for c in specs]}"
    return found[0]


def test_runs_page_lists_filters_and_selects(open_page: Any, store: Any) -> None:
    at = open_page("runs")
    table = at.dataframe[0].value
    assert sorted(table["run_id"]) == ["run-bce", "run-detr", "run-w"]
    assert {"status", "best_loss", "max_loss", "last_loss", "tags", "config.lr", "duration_s", "last_step"} <= set(table.columns)
    row = table.set_index("run_id").loc["run-bce"]
    assert row["status"] == "finished" and row["tags"] == "baseline" and row["last_step"] == 299
    status = next(m for m in at.multiselect if m.label == "Status")
    status.set_value(["crashed"]).run()
    assert at.dataframe[0].value["run_id"].tolist() == ["run-detr"]
    status.set_value([]).run()
    next(t for t in at.text_input if t.label.startswith("Search")).set_value("cw-bce").run()
    assert at.dataframe[0].value["run_id"].tolist() == ["run-w"]
    next(t for t in at.text_input if t.label.startswith("Search")).set_value("").run()
    ids = at.dataframe[0].value["run_id"].tolist()
    rows = [ids.index("run-w"), ids.index("run-bce")]
    at.session_state["runs.table"] = {"selection": {"rows": rows, "columns": [], "cells": []}}
    at.run()
    assert at.session_state["tracker.runs"] == ["run-w", "run-bce"]
    at.switch_page("views/curves.py").run()
    assert not at.exception
    assert at.sidebar.multiselect[0].value == ["run-w", "run-bce"]
    assert sorted(at.dataframe[0].value["run"]) == ["bce", "weighted"]


def test_curves_page_overlays_runs_with_resume_marks(open_page: Any, charts_of: Any) -> None:
    at = open_page("curves", run=["run-w", "run-bce"], key="loss/total")
    spec = chart(charts_of, at, "curves.chart")
    assert layer_marks(spec)[:3] == ["area", "line", "line"]  # band, bucket means, smoothed line
    assert "rule" in layer_marks(spec) and "text" in layer_marks(spec)
    rows = all_rows(spec)
    assert {r["run"] for r in rows if "mean" in r} == {"weighted", "bce"}
    resumes = [r for r in rows if r.get("reason") == "resume"]
    assert [(r["run"], r["step"]) for r in resumes] == [("weighted", 150)]
    summary = at.dataframe[0].value.set_index("run")
    assert summary.loc["bce", "last step"] == 299 and summary.loc["weighted", "last step"] == 260
    assert summary.loc["weighted", "NaN/inf"] == 1
    assert summary.loc["bce", "points in range"] == 300 and bool(summary.loc["bce", "full detail"])
    weighted = sorted((r["step"], r["mean"]) for r in rows if r.get("run") == "weighted" and "mean" in r
                      and not r["last"])
    assert [s for s, _ in weighted] == list(range(261))  # no duplicate, no gap across the resume


def test_curves_page_options_log_smoothing_and_superseded_rows(open_page: Any, charts_of: Any) -> None:
    at = open_page("curves", run="run-w", key="loss/total", log="1", smooth="0")
    spec = chart(charts_of, at, "curves.chart")
    scales = [layer.get("encoding", {}).get("y", {}).get("scale", {}).get("type") for layer in flat_layers(spec)]
    assert "log" in scales
    assert layer_marks(spec)[:2] == ["area", "line"] and layer_marks(spec).count("line") == 1
    next(t for t in at.toggle if t.label.startswith("Show rows superseded")).set_value(True).run()
    spec = chart(charts_of, at, "curves.chart")
    hidden = [r for r in all_rows(spec) if r.get("segment") == 0 and "mean" in r and not r.get("last")]
    assert sorted(r["step"] for r in hidden) == list(range(150, 200))


def test_zoom_by_url_and_by_slider_queries_full_detail(open_page: Any, charts_of: Any) -> None:
    at = open_page("curves", run="run-bce", key="loss/total", lo="100", hi="120", step="110")
    spec = chart(charts_of, at, "curves.chart")
    steps = sorted({r["step"] for r in all_rows(spec) if "mean" in r and r.get("run") == "bce"})
    assert steps == list(range(100, 121))
    focus = [r for r in all_rows(spec) if set(r) == {"step"}]
    assert focus == [{"step": 110}]
    slider = next(s for s in at.slider if s.label.startswith("Step range"))
    slider.set_value((200, 240)).run()
    spec = chart(charts_of, at, "curves.chart")
    steps = sorted({r["step"] for r in all_rows(spec) if "mean" in r and r.get("run") == "bce"})
    assert steps == list(range(200, 241))
    assert at.dataframe[0].value["points in range"].tolist() == [41]


def test_curves_page_downsamples_beyond_the_budget(open_page: Any, charts_of: Any, store: Any) -> None:
    import tracker

    run = tracker.init("yolo", name="long", run_id="run-long", home=store.home, loggers=["store"],
                       config={"analysis": False})
    for s in range(5000):
        run.log({"loss/total": 1.0 + (s % 7)}, step=s)
    run.finish()
    at = open_page("curves", run="run-long", key="loss/total")
    next(s for s in at.select_slider if s.label == "Points per series").set_value(250).run()
    rows = [r for r in all_rows(chart(charts_of, at, "curves.chart")) if "mean" in r]
    body = [r for r in rows if not r["last"]]
    assert len(body) == 250 and sum(r["n"] for r in body) == 5000
    assert min(r["lo"] for r in body) == 1.0 and max(r["hi"] for r in body) == 7.0
    assert [r["step"] for r in rows if r["last"]] == [4999]
    assert "downsampled in SQL" in at.caption[-1].value


def test_per_class_page(open_page: Any, charts_of: Any, seeded: Any) -> None:
    at = open_page("classes", run="run-w")
    heat = chart(charts_of, at, "classes.heatmap")
    assert {r["class_name"] for r in all_rows(heat)} == set(seeded.classes)
    assert max(r["step"] for r in all_rows(heat)) == 140
    ranking = chart(charts_of, at, "classes.ranking")
    assert "hconcat" in ranking  # the class weights are drawn beside the ranked bars
    ranked = {r["class_name"]: r for r in all_rows(ranking)}
    assert ranked["hair drier"]["weight"] == 3.0 and ranked["hair drier"]["group"] == "rare"
    share = chart(charts_of, at, "classes.share")
    assert {r["class_name"] for r in all_rows(share)} == set(seeded.classes)
    assert share["title"]["text"] == "top 4 of 4 classes"
    rare = chart(charts_of, at, "classes.rare")
    assert {r["group"] for r in all_rows(rare)} == {"rare", "common", "frequent"}
    assert any("Counts from run config" in c.value for c in at.caption)


def test_per_class_page_with_counts_from_a_coco_file(open_page: Any, charts_of: Any) -> None:
    at = open_page("classes", run="run-bce")
    next(t for t in at.text_input if t.label.startswith("Class counts file")).set_value(COCO_100).run()
    assert not at.exception and not at.error
    assert any(COCO_100 in c.value for c in at.caption)
    ranked = {r["class_name"]: r for r in all_rows(chart(charts_of, at, "classes.rare")) if "count" in r}
    assert ranked["person"]["count"] == 256 and ranked["person"]["group"] == "frequent"
    assert "hconcat" not in chart(charts_of, at, "classes.ranking")  # run-bce has no class weights


def test_per_class_page_without_per_class_values(open_page: Any) -> None:
    at = open_page("classes", run="run-detr")
    assert any("logged no per-class values" in i.value for i in at.info)


def test_events_page_links_to_the_curve(open_page: Any, charts_of: Any) -> None:
    at = open_page("events", run="run-w")
    table = at.dataframe[0].value
    assert table[["step", "kind"]].values.tolist() == [[120, "divergence"], [260, "nan"]]
    assert table["curve"].tolist()[1] == "curves?run=run-w&step=260&key=loss%2Ftotal"
    at.session_state["events.table"] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    at.run()
    spec = chart(charts_of, at, "events.chart")
    assert [r for r in all_rows(spec) if set(r) == {"step"}] == [{"step": 260}]
    flagged = sorted((r["step"], r["kind"], r["mark"]) for r in all_rows(spec) if "mark" in r)
    assert flagged == [(260, "nan", "rule"), (260, "non-finite", "point")]
    steps = [r["step"] for r in all_rows(spec) if "mean" in r]
    assert min(steps) <= 235 and max(steps) == 260
    next(b for b in at.button if b.label == "Open on the Curves page").click().run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Curves"]
    assert at.query_params["step"] in ("260", ["260"])
    assert [r for r in all_rows(chart(charts_of, at, "curves.chart")) if set(r) == {"step"}] == [{"step": 260}]


def test_events_page_filters(open_page: Any) -> None:
    at = open_page("events")
    assert len(at.dataframe[0].value) == 3
    next(m for m in at.multiselect if m.label == "Severity").set_value(["error"]).run()
    assert at.dataframe[0].value["kind"].tolist() == ["nan"]


def test_sql_page_runs_read_only_queries(open_page: Any) -> None:
    at = open_page("sql")
    assert sorted(at.dataframe[0].value["run_id"]) == ["run-bce", "run-detr", "run-w"]
    assert len(at.get("download_button")) == 1
    expanders = {e.label for e in at.expander}
    assert {"runs", "metrics", "curves", "class_curves", "events", "segments"} <= expanders
    at.text_area[0].set_value("DELETE FROM runs").run()
    at.button[0].click().run()
    assert "read-only: DELETE statements are refused" in at.error[0].value
    at.text_area[0].set_value("SELECT key, count(*) AS n FROM curves GROUP BY key ORDER BY key").run()
    at.button[0].click().run()
    assert not at.error
    assert at.dataframe[0].value.values.tolist() == [["loss", 50], ["loss/box", 560], ["loss/total", 561]]
    next(t for t in at.toggle if t.label == "Quick chart").set_value(True).run()
    assert len(at.get("vega_lite_chart")) == 1


def test_sql_page_refuses_file_reads(open_page: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    at = open_page("sql")
    at.text_area[0].set_value(f"SELECT * FROM read_csv('{secret}')").run()
    at.button[0].click().run()
    assert "file access and settings are switched off" in at.error[0].value


def test_live_run_refreshes(open_page: Any, store: Any) -> None:
    import streamlit as st

    import tracker

    run = tracker.init("yolo", name="live", run_id="run-live", home=store.home, loggers=["store"],
                       config={"analysis": False})
    try:
        for s in range(100):
            run.log({"loss/total": 1.0 / (s + 1)}, step=s)
        run.flush()
        at = open_page("curves", run="run-live", key="loss/total")
        assert "live, refreshing every 2 s" in at.caption[-1].value
        assert at.dataframe[0].value["last step"].tolist() == [99]
        for s in range(100, 150):
            run.log({"loss/total": 1.0 / (s + 1)}, step=s)
        run.flush()
        st.cache_data.clear()  # what the 2 s time-to-live does between two refreshes
        at.run()
        assert at.dataframe[0].value["last step"].tolist() == [149]
    finally:
        run.finish()


@pytest.mark.parametrize("page", ["runs", "curves", "classes", "events", "sql"])
def test_pages_leave_the_store_free(page: str, open_page: Any, store: Any) -> None:
    at = open_page(page, run="run-w")
    assert not at.exception
    with store.connect(write=True, timeout=0.0) as con:  # no connection is held between reruns
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


def test_an_empty_store_says_how_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app_page: Any) -> None:
    monkeypatch.setenv("TRACKER_HOME", str(tmp_path / "empty"))
    at = app_page()  # asserts no exception
    assert "No runs yet" in at.info[0].value


def test_ranks_are_separate_series(open_page: Any, charts_of: Any, store: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tracker

    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        run = tracker.init("yolo", name="ddp", run_id="run-ddp", home=store.home, loggers=["store"],
                           resume="never" if rank == 0 else "allow", resume_step=0 if rank else None,
                           config={"analysis": False})
        for epoch in range(3):
            run.log({"rng/fingerprint": float(epoch * 10 + rank), "rng/epoch": float(epoch)}, step=epoch * 100)
        run.finish()
    at = open_page("curves", run="run-ddp", key="rng/fingerprint")
    rows = [r for r in all_rows(chart(charts_of, at, "curves.chart")) if "mean" in r and not r["last"]]
    by_series: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r["step"]):
        by_series.setdefault(r["run"], []).append(r["mean"])
    assert by_series == {"ddp r0": [0.0, 10.0, 20.0], "ddp r1": [1.0, 11.0, 21.0]}
    assert sorted(at.dataframe[0].value["run"]) == ["ddp r0", "ddp r1"]


def curve_spec(charts_of: Any, at: Any) -> dict[str, Any]:
    """The curves chart (on the time axes it is drawn without a selection, so without a key)."""
    specs = [c for c in charts_of(at) if "layer" in c and "line" in layer_marks(c)]
    assert len(specs) == 1, [layer_marks(c) for c in specs]
    return specs[0]


def flat_layers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for layer in spec.get("layer", []):
        out.extend(flat_layers(layer) if "layer" in layer else [layer])
    return out


@pytest.mark.parametrize("axis", ["wall time", "relative time (s)"])
def test_curves_on_time_axes_break_at_resumes_and_keep_the_marks(open_page: Any, charts_of: Any, axis: str,
                                                                  store: Any) -> None:
    at = open_page("curves", run=["run-w", "run-bce"], key="loss/total")
    next(r for r in at.radio if r.label == "x axis").set_value(axis).run()
    assert not at.exception, [e.value for e in at.exception]
    spec = curve_spec(charts_of, at)
    layers = flat_layers(spec)
    field = "time" if axis == "wall time" else "elapsed_s"
    line = next(l for l in layers if l["mark"] == "line" or l["mark"].get("type") == "line")
    assert line["encoding"]["x"]["field"] == field
    assert line["encoding"]["detail"]["field"] == "piece"  # one line per segment: none across the stop
    axis_spec = line["encoding"]["x"]["axis"]
    if axis == "wall time":
        assert line["encoding"]["x"]["type"] == "temporal" and axis_spec["format"] == "%H:%M:%S"
    else:
        assert "pad(" in axis_spec["labelExpr"] and "m:ss" in line["encoding"]["x"]["title"]
    rows = all_rows(spec)
    pieces = {(r["step"] >= 150, r["piece"]) for r in rows if r.get("run") == "weighted" and "mean" in r}
    assert pieces == {(False, 0), (True, 1)}
    assert {r["piece"] for r in rows if r.get("run") == "bce" and "mean" in r} == {0}
    wall = {r["step"]: r["time"] for r in rows if r.get("run") == "weighted" and "mean" in r and not r["last"]}
    resume = next(r for r in rows if r.get("reason") == "resume")
    # wall times are epoch milliseconds: a float64 of epoch seconds resolves about 0.24 us, so the
    # elapsed time is compared to the microsecond, not to a relative 1e-6
    assert resume["step"] == 150 and resume[field] == (
        pytest.approx(wall[150]) if field == "time" else pytest.approx((wall[150] - min(wall.values())) / 1000, abs=1e-6))
    rule_fields = [l["encoding"]["x"]["field"] for l in layers if l["mark"] in ("rule", {"type": "rule"})
                   or (isinstance(l["mark"], dict) and l["mark"].get("type") == "rule")]
    assert rule_fields and set(rule_fields) == {field}


def test_curves_mark_events_and_non_finite_values(open_page: Any, charts_of: Any) -> None:
    at = open_page("curves", run="run-w", key="loss/total")
    spec = chart(charts_of, at, "curves.chart")
    rows = all_rows(spec)
    flagged = sorted((r["step"], r["kind"], r["severity"], r["mark"]) for r in rows if "mark" in r)
    assert flagged == [(120, "divergence", "warning", "rule"), (260, "nan", "error", "rule"),
                       (260, "non-finite", "error", "point")]
    nan_event = next(r for r in rows if r.get("kind") == "nan")
    assert nan_event["message"] == "loss/total is NaN"
    layers = flat_layers(spec)
    colour = next(l["encoding"]["color"] for l in layers if l["encoding"].get("color", {}).get("field") == "severity")
    assert colour["scale"]["domain"] == ["info", "warning", "error"]
    assert any("message" == t.get("field") for l in layers for t in l["encoding"].get("tooltip", [])
               if isinstance(t, dict))
    assert spec["resolve"]["scale"]["color"] == "independent"


def test_sql_quick_chart_on_a_value_column(open_page: Any, charts_of: Any) -> None:
    at = open_page("sql")
    at.text_area[0].set_value("SELECT step, value FROM curves WHERE run_id = 'run-bce' AND key = 'loss/total'").run()
    at.button[0].click().run()
    assert not at.error
    next(t for t in at.toggle if t.label == "Quick chart").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    spec = charts_of(at)[0]
    rows = all_rows(spec)
    assert len(rows) == 300 and {r["series"] for r in rows} == {"value"}
    assert spec["encoding"]["x"]["field"] == "step" and spec["encoding"]["y"]["title"] == "value"


def test_per_class_page_at_80_classes(open_page: Any, charts_of: Any, coco_run: Any) -> None:
    from tracker.weights import class_weights

    at = open_page("classes", run=coco_run.run_id)
    assert not at.exception and not at.error
    heat = chart(charts_of, at, "classes.heatmap")
    assert heat["height"] >= 14 * 80  # a row per class, tall enough to name each one
    axis = heat["encoding"]["y"]["axis"]
    assert axis["labelOverlap"] is False and axis["labelFlush"] is False
    assert {r["class_name"] for r in all_rows(heat)} == set(coco_run.names)
    ranking = chart(charts_of, at, "classes.ranking")
    bars, weights = ranking["hconcat"]
    assert bars["height"] >= 14 * 80 and bars["encoding"]["y"]["axis"]["labelOverlap"] is False
    expected = class_weights(coco_run.counts, "effective_number", beta=0.999)
    ranked = {r["class_name"]: r for r in all_rows(ranking)}
    assert len(ranked) == 80
    for i, name in enumerate(coco_run.names):
        assert ranked[name]["weight"] == pytest.approx(expected[i])
    assert any("effective_number" in c.value and "beta 0.999" in c.value for c in at.caption)
    assert not any("no class_weights" in c.value for c in at.caption)
    # one colour per group, the same in every chart that colours by group
    scales = []
    for spec in (bars, *chart(charts_of, at, "classes.rare")["hconcat"]):
        colour = spec["encoding"]["color"]
        assert colour["field"] == "group" and colour["legend"]["orient"] == "top"
        scales.append((tuple(colour["scale"]["domain"]), tuple(colour["scale"]["range"])))
    assert len(set(scales)) == 1 and scales[0][0] == ("rare", "common", "frequent")
    assert len(set(scales[0][1])) == 3
    assert ranked["hair drier"]["group"] == "rare" and ranked["person"]["group"] == "frequent"
    share = chart(charts_of, at, "classes.share")
    domain = share["encoding"]["color"]["scale"]["domain"]
    colours = share["encoding"]["color"]["scale"]["range"]
    assert len(domain) == 10 and "other" not in domain and len(set(colours)) == 10
    assert {r["class_name"] for r in all_rows(share)} == set(domain)
    assert share["title"]["text"].startswith("top 10 of 80 classes; the other 70 carry ")
    assert all(0 < r["other"] < 1 for r in all_rows(share))


def test_class_weights_are_read_where_the_run_has_them(seeded: Any) -> None:
    from tracker.weights import class_weights
    from webui.class_queries import class_weights_of

    names = seeded.classes
    assert class_weights_of({"class_weights": seeded.weights}, names).weights.tolist() == seeded.weights
    by_name = class_weights_of({"loss": {"class_weights": dict(zip(names, seeded.weights))}}, names)
    assert by_name.weights.tolist() == seeded.weights and "loss.class_weights" in by_name.source
    found = class_weights_of({"loss": {"scheme": "inverse", "normalize": "none"}, "class_counts": seeded.counts},
                             names)
    assert found.weights == pytest.approx(1 / np.array(seeded.counts, float))
    assert "'inverse'" in found.source
    demo_like = {"loss": {"scheme": "effective_number", "beta": 0.99, "counts": seeded.counts}}
    assert class_weights_of(demo_like, names).weights == pytest.approx(
        class_weights(seeded.counts, "effective_number", beta=0.99))
    plain = class_weights_of({"loss": {"scheme": "none"}}, names)
    assert plain.weights is None and "unweighted" in plain.source
    missing = class_weights_of({"loss": {"scheme": "inverse"}}, names)
    assert missing.weights is None and "no class counts" in missing.source
    assert class_weights_of({"loss": "bce"}, names).weights is None


def test_runs_page_keeps_class_counts_in_one_column(open_page: Any, coco_run: Any) -> None:
    at = open_page("runs")
    table = at.dataframe[0].value.set_index("run_id")
    assert not [c for c in table.columns if c.startswith("config.class_counts.")]
    assert table.loc["run-coco", "config.class_counts"] == "80 values, 198 … 262465"
    assert table.loc["run-coco", "config.loss.counts"] == "80 values, 198 … 262465"
    assert table.loc["run-coco", "config.loss.scheme"] == "effective_number"
    assert len([c for c in table.columns if c.startswith("config.")]) < 12


def test_quick_chart_takes_any_column_names() -> None:
    import polars as pl

    from webui.charts import quick_chart

    frame = pl.DataFrame({"series": [1, 2, 3], "y": [0.5, 0.25, 0.125], "value": [3, 2, 1]})
    spec = quick_chart(frame, "series", ["y", "value"], "line").to_dict()
    rows = next(iter(spec["datasets"].values()))
    assert len(rows) == 6
    x, y, colour = (spec["encoding"][c]["field"] for c in ("x", "y", "color"))
    assert {(r[x], r[colour], r[y]) for r in rows} == {
        (1, "y", 0.5), (2, "y", 0.25), (3, "y", 0.125), (1, "value", 3), (2, "value", 2), (3, "value", 1)}
    assert spec["encoding"]["x"]["title"] == "series"


def test_relative_time_counts_from_the_run_start_when_zoomed(open_page: Any, charts_of: Any) -> None:
    at = open_page("curves", run="run-bce", key="loss/total", x="relative time (s)")
    rows = {r["step"]: r["elapsed_s"] for r in all_rows(curve_spec(charts_of, at)) if "mean" in r and not r["last"]}
    assert rows[0] == 0.0 and rows[250] > rows[200] > 0
    zoomed = open_page("curves", run="run-bce", key="loss/total", x="relative time (s)", lo="200", hi="250")
    again = {r["step"]: r["elapsed_s"] for r in all_rows(curve_spec(charts_of, zoomed)) if "mean" in r}
    assert min(again) == 200 and again[200] == pytest.approx(rows[200]) and again[250] == pytest.approx(rows[250])
