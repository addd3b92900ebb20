"""The CLI starts at once: ``tracker --help`` loads no command, no plugin and no heavy
library once its listing is kept, lists what a full load lists, and every listed
command still runs; ``tracker runs list`` loads neither pyarrow, numpy nor rich."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import tracker
from tracker.cli import CORE_COMMANDS, build_cli
from tracker.commands import _listing

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("polars", "pyarrow", "duckdb", "numpy", "rich", "tracker.analysis", "tracker.host", "tracker.store.local")
PLUGIN_COMMANDS = {"coco", "gpu"}  # what the built-in plugins add through tracker_register_commands

# runs ``tracker`` the way the console script does, then reports what it imported
CHILD = """
import json, sys
from tracker.cli import main
report = {}
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit as exc:
        assert not exc.code, exc.code
    heavy = [m for m in %r if m in sys.modules]
    commands = sorted(m for m in sys.modules if m.startswith("tracker.commands."))
    report[" ".join(argv)] = {"heavy": heavy, "commands": commands}
print(json.dumps(report), file=sys.stderr)
""" % (HEAVY,)


def run_tracker(cache: Path, *argvs: list[str], **env: str) -> tuple[str, list[str], dict[str, dict[str, list[str]]]]:
    """``tracker ARGV...`` in one fresh interpreter with ``cache`` as XDG_CACHE_HOME: stdout,
    the other lines of stderr, and what each call had imported by its end."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache), **env}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argvs)], env=full_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *err, report = out.stderr.strip().splitlines()
    return out.stdout, err, json.loads(report)


def listed(help_text: str) -> set[str]:
    """The names in the Commands section of a help text."""
    section = help_text.split("Commands:\n", 1)[1]
    return {line.split()[0] for line in section.splitlines() if line.startswith("  ") and line[2] != " "}


def test_help_from_the_kept_listing_loads_nothing_heavy_and_lists_every_command(tmp_path: Path) -> None:
    for rid in ("a", "b"):
        run = tracker.init("proj", run_id=rid, tags=["t"])
        run.log({"loss": 1.0}, step=0)
        run.finish()
    tracker.store.release()
    built, err, _ = run_tracker(tmp_path, ["--help"])  # loads every command and keeps the listing
    assert built.startswith("Usage: ") and not err, err
    assert set(CORE_COMMANDS) | PLUGIN_COMMANDS <= listed(built)  # and any installed third-party plugin's
    (kept_file,) = (tmp_path / "tracker").glob("commands-*.json")
    kept = json.loads(kept_file.read_text())
    kept["failures"] = {"broken": "import failed: ImportError: no module named nope"}  # as if a plugin had failed
    kept_file.write_text(json.dumps(kept))

    out, err, imported = run_tracker(tmp_path, ["--help"], ["runs", "list"])
    assert out.startswith(built)  # the same help, then the run list
    assert imported["--help"] == {"heavy": [], "commands": ["tracker.commands._listing"]}
    assert err == ["plugin broken disabled: import failed: ImportError: no module named nope", "runs in " + str(
        Path(os.environ["TRACKER_HOME"]))]
    # runs list loads its own module and the store, not pyarrow, numpy nor rich (its output is a pipe)
    after_list = imported["runs list"]
    assert "tracker.commands.runs" in after_list["commands"] and "tracker.commands.sql" not in after_list["commands"]
    assert {"duckdb", "polars"} <= set(after_list["heavy"])
    assert not {"pyarrow", "numpy", "rich", "tracker.analysis", "tracker.host"} & set(after_list["heavy"])
    rows = [line.split("\t") for line in out.splitlines() if line.startswith(("a\t", "b\t"))]
    assert sorted(r[0] for r in rows) == ["a", "b"] and all(r[-1] == "t" for r in rows)


def test_disabled_plugins_name_another_kept_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _listing.identity()
    monkeypatch.setenv("TRACKER_DISABLE_PLUGINS", "coco,vulkan_exec")
    disabled = _listing.identity()
    assert disabled["disabled"] == "coco,vulkan_exec"
    assert _listing.cache_file(disabled) != _listing.cache_file(plain)


def test_every_listed_command_runs() -> None:
    cli = build_cli()
    names = cli.list_commands(click.Context(cli))
    assert set(CORE_COMMANDS) | PLUGIN_COMMANDS <= set(names)
    for name in names:
        res = CliRunner().invoke(cli, [name, "--help"], prog_name="tracker")
        assert res.exit_code == 0, (name, res.output)
        assert res.output.startswith(f"Usage: tracker {name} ")
    res = CliRunner().invoke(cli, ["runs", "list", "--format", "json"])
    assert res.exit_code == 1 and "No store found" in res.output  # a real call: the store module loads


def test_a_kept_listing_goes_stale_when_a_source_or_a_path_folder_changes(tmp_path: Path) -> None:
    site, plugin = tmp_path / "site-packages", tmp_path / "plugin.py"
    site.mkdir()
    plugin.write_text("# a plugin\n")
    os.utime(plugin, ns=(1_000_000_000, 1_000_000_000))
    os.utime(site, ns=(1_000_000_000, 1_000_000_000))
    assert _listing.cache_file(_listing.identity()).parent == _listing.cache_dir()
    ident = {**_listing.identity(), "path": [str(site)]}
    commands = {"hello": click.Command("hello", help="Say hello.", callback=lambda: None)}
    kept = _listing.record(ident, commands, [types.SimpleNamespace(__file__=str(plugin))], [], {})
    assert kept is not None and str(plugin) in kept["files"]
    assert _listing.is_fresh(kept, ident)
    assert not _listing.is_fresh(kept, {**ident, "disabled": "coco"})
    os.utime(plugin, ns=(2_000_000_000, 2_000_000_000))  # the plugin's file changed
    assert not _listing.is_fresh(kept, ident)
    os.utime(plugin, ns=(1_000_000_000, 1_000_000_000))
    (site / "new_plugin-1.0.dist-info").mkdir()  # a package was installed
    os.utime(site, ns=(3_000_000_000, 3_000_000_000))
    assert not _listing.is_fresh(kept, ident)
    stub = _listing.stub("hello", kept["commands"]["hello"])
    assert stub.get_short_help_str(40) == commands["hello"].get_short_help_str(40)


def test_a_command_with_its_own_short_help_is_never_kept() -> None:
    class Custom(click.Command):
        def get_short_help_str(self, limit: int = 45) -> str:
            return "computed"

    assert _listing.record(_listing.identity(), {"x": Custom("x")}, [], [], {}) is None


def test_list_columns_stream_into_the_same_frame_as_through_pyarrow() -> None:
    import duckdb

    from tracker.store.local import _streams, result_frame

    con = duckdb.connect()
    sql = ("SELECT * FROM (VALUES (['x', NULL], [1.5]::DOUBLE[], [[1, 2], [3]]), (NULL, [], NULL), ([], NULL, [[]]))"
           " v(tags, d, nested)")
    assert all(_streams(t) for t in con.sql(sql).types)  # this query takes the path without pyarrow
    assert not _streams(con.sql("SELECT {'a': 1} AS s").types[0])  # a struct does not
    streamed = result_frame(con, sql)
    assert streamed.equals(con.execute(sql).pl()) and streamed.schema == con.execute(sql).pl().schema
    assert streamed["tags"].to_list() == [["x", None], None, []]
