"""The tracker web UI (Streamlit): ``streamlit run webui`` or ``tracker ui``.

Layout: ``streamlit_app.py`` routes with ``st.navigation`` to the thin pages in
``views/`` (not ``pages/``: Streamlit would treat that folder as an old-style
multipage app and skip the router); data comes from plain functions returning
polars frames (``queries``, ``class_queries``, ``downsample``, ``sql``), charts from
``charts``, Streamlit glue from ``state`` and plugin pages from ``panels``.
"""
