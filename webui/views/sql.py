"""SQL: a read-only query box over the store, with the schema beside it (see ``webui/sql.py``)."""

from __future__ import annotations

import streamlit as st

from tracker.errors import TrackerError
from webui import charts, sql, state

EXAMPLES = {
    "Runs": (
        "SELECT run_id, project, name, status, last_step, n_points, segments\n"
        "FROM run_summary ORDER BY created_at DESC"
    ),
    "Last value of each key": (
        "SELECT run_id, key, arg_max(value, step) AS last, max(step) AS step\n"
        "FROM curves GROUP BY ALL ORDER BY run_id, key"
    ),
    "Resumes": "SELECT run_id, rank, segment, start_step, end_step, reason\nFROM segments ORDER BY ALL",
    "Rows hidden by resumes": (
        "SELECT run_id, segment, count(*) AS rows, min(step), max(step)\nFROM hidden_metrics GROUP BY ALL"
    ),
    "Per-class mean, last 100 steps": (
        "SELECT run_id, key, class_name, avg(value) AS mean FROM class_curves\n"
        "WHERE step > (SELECT max(step) - 100 FROM class_curves) GROUP BY ALL ORDER BY mean DESC LIMIT 20"
    ),
}

st.title("SQL")
left, right = st.columns([3, 1])
with right:
    st.subheader("Schema")
    schema = state.load("schema_info")
    for table in schema["table"].unique(maintain_order=True).to_list():
        with st.expander(table):
            cols = schema.filter(schema["table"] == table)
            st.markdown("\n".join(f"- `{c}` {t}" for c, t in zip(cols["column"], cols["type"])))
with left:
    example = st.selectbox("Examples", list(EXAMPLES), index=None, placeholder="Start from an example")
    text = st.text_area(
        "Query (read-only: SELECT, WITH, DESCRIBE, SHOW, EXPLAIN, PRAGMA table_info)",
        value=EXAMPLES[example] if example else EXAMPLES["Runs"], height=160, key=f"sql.text.{example}",
    )
    max_rows = st.number_input("Max rows", min_value=1, max_value=1_000_000, value=10_000, step=1000)
    if st.button("Run", type="primary", icon=":material/play_arrow:") or "sql.result" not in st.session_state:
        try:
            st.session_state["sql.result"] = sql.run_sql(state.store(), text, max_rows=int(max_rows))
            st.session_state.pop("sql.error", None)
        except TrackerError as exc:
            st.session_state["sql.error"] = str(exc)
    if "sql.error" in st.session_state:
        st.error(st.session_state["sql.error"])
    result: sql.SqlResult | None = st.session_state.get("sql.result")
    if result is not None and "sql.error" not in st.session_state:
        frame = result.frame
        st.caption(f"{frame.height} rows" + (f" (cut at {int(max_rows)})" if result.truncated else ""))
        st.dataframe(frame, hide_index=True)
        st.download_button("Download CSV", frame.write_csv(), file_name="query.csv", mime="text/csv",
                           icon=":material/download:")
        numeric = [c for c, t in frame.schema.items() if t.is_numeric()]
        if frame.height and numeric and st.toggle("Quick chart"):
            c1, c2, c3 = st.columns(3)
            x = c1.selectbox("x", frame.columns)
            ys = c2.multiselect("y", [c for c in numeric if c != x], default=[c for c in numeric if c != x][:1])
            kind = c3.radio("Chart", ["line", "bar", "point"], horizontal=True)
            if ys:
                st.altair_chart(charts.quick_chart(frame, x, ys, kind), width="stretch", key="sql.chart")
