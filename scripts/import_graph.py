"""The import graph of tracker/, plugins/, gpu/ and webui/: its circles and the arrows that go up.

    python scripts/import_graph.py [ROOT] [--all]

walks every module with Python's ``ast`` (nothing is imported) and prints

* the import circles (strongly connected components of the graph), and
* the arrows that go up the layers of :data:`LAYERS` (a module importing one above its own
  layer) or cross a line of :data:`FORBIDDEN` (tracker/ importing plugins/, gpu/ or webui/;
  gpu/ importing anything of ours),

each for the module-level imports (what runs when the module is imported), and, with
``--all``, separately for the two other kinds: ``lazy`` imports inside a function (they run
when the function is called, so a circle through one does not break the import) and
``typing`` imports under ``if TYPE_CHECKING:`` (they never run). Exit status 1 when a
module-level circle or upward arrow is found, or a module sits in no layer.

Rules of the walk:

* An edge goes from the importing module to the module it names: ``import a.b`` and
  ``from a import b`` (when ``a.b`` is a module) name ``a.b``; ``from a.b import name``
  names ``a.b``. Only our own modules count; the parent packages Python also runs
  (``a/__init__.py``) are not edges of their own.
* Module level includes class bodies and ``try:``/``if`` blocks at module level; an
  ``if TYPE_CHECKING:`` block is typing; anything inside a ``def`` is lazy.
* Imports by name are not seen: ``importlib.import_module(...)``, the lazy submodules of
  ``tracker/__init__.py`` and the host's list of built-in plugins.

The layers (bottom first) are the map of /work/shared/DESIGN.md: ``gpu/`` is a library
that knows nothing of tracker; ``tracker/`` is the host; ``plugins/`` and ``webui/`` sit on
top of it. Inside ``tracker/`` the order is: the leaves that everything uses (errors,
events, schema, protocols), the public facade and hook specs, pure helpers (numpy/COCO,
weights, losses), the spool and its checks, the run's parts (metadata, loggers, flusher),
the store, the loss analysis (which reads the store, never the run), the run, what
reviews whole runs after the fact, integrations, and the CLI on top.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

ROOTS = ("tracker", "plugins", "gpu", "webui")
KINDS = ("module", "lazy", "typing")

# Bottom first. A module belongs to the first layer with a pattern (fnmatch) matching its
# dotted name; a module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # gpu/: a library of its own (Vulkan compute), below everything else
    ("gpu", ("gpu", "gpu.*")),
    # leaves that every part of the host uses; they import nothing of ours but each other
    ("tracker.base", ("tracker.errors", "tracker.events", "tracker.schema", "tracker.protocols",
                      "tracker.sqlguard", "tracker.hardware", "tracker.dist", "tracker.data")),
    # the public facade (its submodules load lazily, by name), the hook specs and the plugin
    # manager: every layer above may ask the host for what plugins registered
    ("tracker.host", ("tracker", "tracker.hookspecs", "tracker.host")),
    # pure helpers: COCO files, class counts and weights, samplers, loss terms and their
    # conformance checks, the torch bridge; no run, no store
    ("tracker.pure", ("tracker.coco", "tracker.coco.*", "tracker.weights", "tracker.sampling",
                      "tracker.assign", "tracker.losses", "tracker.pairterms", "tracker.embedding_window",
                      "tracker.embedding_slot", "tracker.torch", "tracker.torch_ssl", "tracker.testing", "tracker.testing.*")),
    # the spool (crash-safe files under TRACKER_HOME) and what reads or plans from it alone
    ("tracker.spool", ("tracker.spool", "tracker.spoolcheck", "tracker.runplan", "tracker.runtables")),
    # the store behind one interface (local DuckDB, DuckLake) and the fork rules it applies
    ("tracker.store", ("tracker.store", "tracker.store.*", "tracker.fork")),
    # the run's parts: its metadata files, the loggers' lanes, the system sampler, alerts
    ("tracker.runparts", ("tracker.runmeta", "tracker.loggers", "tracker.system", "tracker.notify",
                          "tracker.notify.*")),
    # loss analysis: the detectors the run streams its rows through (online) and the same
    # detectors over stored runs (offline), smoothing, trends; they read the store, never the run
    ("tracker.analysis", ("tracker.analysis", "tracker.analysis.*")),
    # the run and what works on whole runs through the store
    ("tracker.run", ("tracker.flusher", "tracker.run", "tracker.runstart", "tracker.embeddings",
                     "tracker.importer", "tracker.runsets", "tracker.doctor")),
    # what works on whole runs after the fact: scoring the real corpus (it imports logs through
    # the importer), rare-class reports and advice
    ("tracker.review", ("tracker.analysis.real_corpus", "tracker.rare_classes", "tracker.rare_advice")),
    # adapters to training frameworks, and the demos built on them
    ("tracker.integrations", ("tracker.integrations", "tracker.integrations.*", "tracker.demo")),
    # the CLI and its commands
    ("tracker.cli", ("tracker.cli", "tracker.commands", "tracker.commands.*")),
    # built-in plugins: plain modules with @hookimpl functions (plugins/vulkan_* also use gpu/)
    ("plugins", ("plugins", "plugins.*")),
    # the Streamlit app
    ("webui", ("webui", "webui.*")),
)

# (importer pattern, imported pattern, why): arrows that are wrong whatever the layers say.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("gpu*", "tracker*", "gpu/ knows nothing of tracker/"),
    ("gpu*", "plugins*", "gpu/ knows nothing of plugins/"),
    ("gpu*", "webui*", "gpu/ knows nothing of webui/"),
    ("tracker*", "plugins*", "tracker/ never imports plugins/"),
    ("tracker*", "gpu*", "tracker/ never imports gpu/"),
    ("tracker*", "webui*", "tracker/ never imports webui/"),
    ("plugins*", "webui*", "plugins/ do not import the web UI"),
    ("webui*", "plugins*", "the web UI goes through tracker/, not plugins/"),
)


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target`` (line ``line``), of kind module/lazy/typing."""

    source: str
    target: str
    kind: str
    line: int


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def arrows(self, kinds: Iterable[str]) -> dict[str, set[str]]:
        wanted = set(kinds)
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for e in self.edges:
            if e.kind in wanted and e.source != e.target:
                out[e.source].add(e.target)
        return out


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``tree`` with its kind (module, lazy or typing)."""

    def visit(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, "lazy" if kind == "module" else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from visit(child, kind)

    yield from visit(tree, "module")


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` is or lies in (a.b.c -> a.b when c is not a module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.Import | ast.ImportFrom, source: str, is_pkg: bool,
             modules: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            found = _resolve(alias.name, modules)
            if found:
                yield found
        return
    base = node.module or ""
    if node.level:
        package = source if is_pkg else source.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    for alias in node.names:
        found = _resolve(f"{base}.{alias.name}", modules) if alias.name != "*" else None
        if found and found != _resolve(base, modules):
            yield found
        else:
            found = _resolve(base, modules)
            if found:
                yield found


def build(root: Path, roots: Iterable[str] = ROOTS) -> Graph:
    """Parse every module under ``root``/``roots`` and collect its imports of our modules."""
    graph = Graph()
    for top in roots:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                graph.modules[module_name(root, path)] = path
    for source, path in graph.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        for node, kind in _imports(tree):
            for target in _targets(node, source, is_pkg, graph.modules):
                graph.edges.append(Edge(source, target, kind, node.lineno))
    return graph


def layer_of(module: str) -> int | None:
    """Index of the layer of ``module`` in :data:`LAYERS` (None when no pattern matches); a
    layer that names the module exactly wins over one that matches it by a wildcard."""
    for i, (_name, patterns) in enumerate(LAYERS):
        if module in patterns:
            return i
    for i, (_name, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    return None


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(arrows):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(arrows[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def circle_edges(graph: Graph, component: list[str], kinds: Iterable[str]) -> list[Edge]:
    """The edges of ``kinds`` that run inside one circle."""
    members, wanted = set(component), set(kinds)
    return sorted({(e.source, e.target, e.kind, e.line): e for e in graph.edges
                   if e.kind in wanted and e.source in members and e.target in members
                   and e.source != e.target}.values(), key=lambda e: (e.source, e.target, e.line))


def upward(graph: Graph, kinds: Iterable[str]) -> list[tuple[Edge, str]]:
    """Edges of ``kinds`` that go up the layers or cross a FORBIDDEN line, with the reason."""
    wanted = set(kinds)
    out: list[tuple[Edge, str]] = []
    seen: set[tuple[str, str, str]] = set()
    for e in graph.edges:
        if e.kind not in wanted or e.source == e.target or (e.source, e.target, e.kind) in seen:
            continue
        reason = next((why for src, dst, why in FORBIDDEN
                       if fnmatch.fnmatchcase(e.source, src) and fnmatch.fnmatchcase(e.target, dst)), None)
        low, high = layer_of(e.source), layer_of(e.target)
        if reason is None and low is not None and high is not None and high > low:
            reason = f"layer {LAYERS[low][0]} imports layer {LAYERS[high][0]}"
        if reason:
            seen.add((e.source, e.target, e.kind))
            out.append((e, reason))
    return sorted(out, key=lambda item: (item[0].source, item[0].target))


def unplaced(graph: Graph) -> list[str]:
    """Modules that no layer pattern matches."""
    return sorted(m for m in graph.modules if layer_of(m) is None)


def report(graph: Graph, kinds: tuple[str, ...], arrow_kinds: tuple[str, ...] | None = None,
           ) -> tuple[list[str], int]:
    """Text lines for the circles of ``kinds`` and the upward arrows of ``arrow_kinds``
    (default ``kinds``), and how many there are."""
    lines: list[str] = []
    found = circles(graph.arrows(kinds))
    label = "+".join(kinds)
    lines.append(f"circles ({label} imports): {len(found)}")
    for component in found:
        lines.append("  " + " <-> ".join(component))
        for e in circle_edges(graph, component, kinds):
            lines.append(f"      {e.source}:{e.line} -> {e.target} [{e.kind}]")
    arrow_kinds = arrow_kinds or kinds
    ups = upward(graph, arrow_kinds)
    label = "+".join(arrow_kinds)
    lines.append(f"upward arrows ({label} imports): {len(ups)}")
    for e, why in ups:
        lines.append(f"  {e.source}:{e.line} -> {e.target} [{e.kind}]  ({why})")
    return lines, len(found) + len(ups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]),
                        help="the repository root (default: this script's)")
    parser.add_argument("--all", action="store_true", help="also list lazy and typing imports, each on its own")
    args = parser.parse_args(argv)
    graph = build(Path(args.root))
    print(f"{len(graph.modules)} modules, {len(graph.edges)} imports of our own modules: "
          + ", ".join(f"{sum(1 for e in graph.edges if e.kind == k)} {k}" for k in KINDS))
    missing = unplaced(graph)
    if missing:
        print(f"modules in no layer (add them to LAYERS): {', '.join(missing)}")
    lines, bad = report(graph, ("module",))
    print("\n".join(lines))
    if args.all:
        for extra in ("lazy", "typing"):
            print()
            print("\n".join(report(graph, ("module", extra), (extra,))[0]))
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
