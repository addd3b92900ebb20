"""docs/plugins.md stays true: every hook is in it, and every example file it names exists."""

from __future__ import annotations

import re
from pathlib import Path

from tracker import hookspecs

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"
EXAMPLE = ROOT / "examples" / "tracker-example-plugin"


def test_every_hook_is_in_the_guide() -> None:
    text = GUIDE.read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("tracker_")]
    assert len(hooks) >= 10
    for name in hooks:
        assert f"`{name}(" in text, f"{name} is not in docs/plugins.md"


def test_the_files_the_guide_names_exist() -> None:
    text = GUIDE.read_text()
    tree = text[text.index("tracker-example-plugin/\n"):]
    tree = tree[: tree.index("```")]
    named = re.findall(r"^\s+(\S+\.(?:py|toml))", tree, flags=re.M)
    assert len(named) == 7
    for path in named:
        assert (EXAMPLE / path).is_file(), path
    for linked in re.findall(r"\]\((\.\./[^)]+)\)", text):
        assert (GUIDE.parent / linked).exists(), linked


def test_the_example_registers_every_registration_hook() -> None:
    plugin = (EXAMPLE / "src" / "tracker_example" / "plugin.py").read_text()
    for kind in ("losses", "kernels", "samplers", "loggers", "detectors", "panels"):
        assert f"def tracker_register_{kind}(register: Register) -> None:" in plugin
