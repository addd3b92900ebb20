"""The import graph keeps its shape: no module-level circle, no arrow up the layers.

The rules and the layer table live in scripts/import_graph.py (run it to see the whole
picture, lazy and typing imports included). Only imports that run when a module is
imported are held to them here: a function-level import or one under TYPE_CHECKING may
point up or close a circle.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Known exceptions, to be removed: module-level edges (importer, imported) that still close
# a circle or point up while the store and the run are being split apart. Empty now; an
# edge may be added here only with the refactoring that removes it named beside it.
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


ig = _load()


@pytest.fixture(scope="module")
def graph() -> Any:
    return ig.build(ROOT)


def _without_exceptions(arrows: dict[str, set[str]]) -> dict[str, set[str]]:
    return {src: {dst for dst in dsts if (src, dst) not in KNOWN_EXCEPTIONS} for src, dsts in arrows.items()}


def test_no_module_level_circle(graph: Any) -> None:
    found = ig.circles(_without_exceptions(graph.arrows(["module"])))
    detail = [f"{' <-> '.join(c)}: " + ", ".join(f"{e.source}:{e.line} -> {e.target}"
                                                   for e in ig.circle_edges(graph, c, ["module"])) for c in found]
    assert not found, "module-level import circles (make one of the imports lazy or move the shared part " \
                      "down a layer):\n" + "\n".join(detail)


def test_no_module_level_arrow_goes_up_the_layers(graph: Any) -> None:
    ups = [(e, why) for e, why in ig.upward(graph, ["module"]) if (e.source, e.target) not in KNOWN_EXCEPTIONS]
    assert not ups, "module-level imports that go up the layers of scripts/import_graph.py:\n" + "\n".join(
        f"{e.source}:{e.line} -> {e.target} ({why})" for e, why in ups)


def test_every_module_sits_in_a_layer(graph: Any) -> None:
    assert len(graph.modules) > 100  # the walk found the packages
    assert not ig.unplaced(graph), f"add these modules to LAYERS in scripts/import_graph.py: {ig.unplaced(graph)}"


def test_known_exceptions_are_still_edges(graph: Any) -> None:
    edges = {(e.source, e.target) for e in graph.edges if e.kind == "module"}
    assert KNOWN_EXCEPTIONS <= edges, f"remove from KNOWN_EXCEPTIONS: {sorted(KNOWN_EXCEPTIONS - edges)}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_walk_finds_circles_and_upward_arrows_of_each_kind(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "tracker/__init__.py": "",
        "tracker/errors.py": """
            from typing import TYPE_CHECKING
            from tracker.cli import main
            if TYPE_CHECKING:
                from tracker import run
            """,
        "tracker/run.py": "from . import errors\n",
        "tracker/cli.py": """
            import tracker.errors
            def main():
                from tracker.run import Run
            """,
        "plugins/__init__.py": "",
        "plugins/losses.py": "from tracker.errors import TrackerError\n",
        "gpu/__init__.py": "from tracker import errors\n",
        "webui/__init__.py": "",
        "tracker/newcomer.py": "",
    })
    g = ig.build(root)
    kinds = {(e.source, e.target): e.kind for e in g.edges}
    assert kinds == {
        ("tracker.errors", "tracker.cli"): "module", ("tracker.errors", "tracker.run"): "typing",
        ("tracker.run", "tracker.errors"): "module", ("tracker.cli", "tracker.errors"): "module",
        ("tracker.cli", "tracker.run"): "lazy", ("plugins.losses", "tracker.errors"): "module",
        ("gpu", "tracker.errors"): "module",
    }
    assert ig.circles(g.arrows(["module"])) == [["tracker.cli", "tracker.errors"]]
    assert ig.circles(g.arrows(["module", "typing"])) == [["tracker.cli", "tracker.errors", "tracker.run"]]
    ups = {(e.source, e.target): why for e, why in ig.upward(g, ["module"])}
    assert set(ups) == {("tracker.errors", "tracker.cli"), ("gpu", "tracker.errors")}
    assert ups[("gpu", "tracker.errors")] == "gpu/ knows nothing of tracker/"
    assert ig.unplaced(g) == ["tracker.newcomer"]
