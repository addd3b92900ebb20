"""An example third-party plugin for tracker (see docs/plugins.md).

The entry point ``example = "tracker_example.plugin"`` in pyproject.toml is all the
host needs; importing this package imports neither tracker's optional parts nor
Streamlit.
"""

__version__ = "0.1.0"
