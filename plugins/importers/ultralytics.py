"""``tracker import ultralytics DIR...``: Ultralytics training folders.

A training folder holds ``results.csv`` (one row per epoch; keys keep Ultralytics'
names: ``train/box_loss``, ``metrics/mAP50-95(B)``, ``lr/pg0``, ...) and
``args.yaml`` (the training arguments, which become the config; YOLOv5 writes them
to ``opt.yaml``, read when there is no ``args.yaml``). The run is named
after the folder; its project is ``args.yaml``'s project folder, else the parent
folder (``runs/detect/train`` is in project ``detect``). A DIR without
``results.csv`` is searched for training folders below it.

A training killed while saving writes an epoch twice; the later row wins (the
resume rule: a new segment from that epoch). The ``time`` column (seconds since the
start) becomes wall times counted from ``args.yaml``'s modification time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import click

from tracker.errors import DataError
from tracker.importer import Reporter, SourceRun, make_run_id
from plugins.importers.widecsv import read_wide_csv


def _args(folder: Path) -> dict[str, Any]:
    path = folder / "args.yaml"
    if not path.exists():
        path = folder / "opt.yaml"  # YOLOv5's name for the same record
    if not path.exists():
        return {}
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DataError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); fix it or move it "
                        "away to import the folder without its config") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise DataError(f"{path} holds a {type(loaded).__name__}, not a mapping of training arguments")
    return loaded


def read_folder(folder: Path) -> SourceRun:
    """One training folder as a run."""
    config = _args(folder)
    results = folder / "results.csv"
    header = results.read_text().split("\n", 1)[0]
    has_time = "time" in [c.strip() for c in header.split(",")]
    start = (folder / "args.yaml").stat().st_mtime if (folder / "args.yaml").exists() else results.stat().st_mtime
    points, _ = read_wide_csv(results, "epoch", "time" if has_time else None, time_offset=start)
    project = Path(str(config["project"])).name if config.get("project") else folder.resolve().parent.name
    return SourceRun(kind="ultralytics", source=str(folder), name=folder.resolve().name, project=project,
                     run_id=make_run_id("ul", folder.resolve().name, str(folder.resolve())),
                     points=points, config=config, tags=["import:ultralytics"], created_at=start)


class UltralyticsImporter:
    name = "ultralytics"
    help = "Import Ultralytics training folders (results.csv + args.yaml)."
    params = [click.Argument(["dirs"], nargs=-1, required=True,
                             type=click.Path(exists=True, file_okay=False, path_type=Path))]

    def read(self, reporter: Reporter, dirs: tuple[Path, ...], **_: Any) -> Iterator[SourceRun]:
        """Yield one run per training folder."""
        folders: list[Path] = []
        for d in dirs:
            found = [d] if (d / "results.csv").exists() else sorted(p.parent for p in d.rglob("results.csv"))
            if not found:
                raise DataError(f"no results.csv in or under {d}; pass an Ultralytics training folder "
                                "such as runs/detect/train")
            folders.extend(found)
        reporter.start("reading training folders", len(folders))
        for folder in folders:
            run = read_folder(folder)
            reporter.advance(1)
            yield run
