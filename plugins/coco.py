"""Built-in plugin: COCO balancing.

Registers the samplers ``repeat_factor`` and ``class_aware`` (from
:mod:`tracker.sampling`) and the ``tracker coco`` command group:

* ``tracker coco stats FILE [--format table|csv|json]``
* ``tracker coco balance FILE --out OUT [--per-class N] [--max-images M] [--target uniform|sqrt]``
* ``tracker coco split FILE --val 0.1 [--out-dir DIR]``

Progress bars go to stderr and only when it is a terminal; tables go to stdout.
"""

from __future__ import annotations

import csv
import io
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, cast

import click
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tracker import hookimpl
from tracker.cli import friendly
from tracker.coco.balance import TARGETS, BalanceResult, Target, balance
from tracker.coco.index import CocoIndex, gc_paused, load
from tracker.coco.split import SplitResult, stratified_split
from tracker.coco.stats import ClassStats, DatasetStats, stats
from tracker.coco.subset import Source, load_for_writing, write_subset, write_subsets
from tracker.sampling import ClassAwareSampler, RepeatFactorSampler, SamplerFactory

SAMPLERS = (
    SamplerFactory("repeat_factor", RepeatFactorSampler,
                   "LVIS repeat-factor sampling: r(c) = max(1, sqrt(t / f(c))), stochastic rounding"),
    SamplerFactory("class_aware", ClassAwareSampler,
                   "class-aware sampling: a class uniformly, then one of its images"),
)


@hookimpl
def tracker_register_samplers(register: Callable[[Any], None]) -> None:
    """Register the repeat-factor and class-aware samplers."""
    for factory in SAMPLERS:
        register(factory)


@hookimpl
def tracker_register_commands(cli: click.Group) -> None:
    """Add the ``tracker coco`` group (stats, balance, split)."""
    cli.add_command(coco_group)


def _stdout() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    return console


@contextmanager
def _progress(label: str) -> Iterator[Callable[[str, float], None]]:
    """A rich progress bar on stderr (off when stderr is not a terminal)."""
    err = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                   TimeElapsedColumn(), console=err, disable=not err.is_terminal, transient=True)
    with bar:
        task = bar.add_task(label, total=1.0)

        def update(phase: str, done: float) -> None:
            bar.update(task, completed=done, description=f"{label}: {phase}")

        yield update


def _load(path: Path, skip_invalid: bool) -> CocoIndex:
    with _progress(f"loading {path.name}") as update:
        index = load(path, skip_invalid=skip_invalid, progress=update)
    _report_skipped(index)
    return index


def _load_source(path: Path, skip_invalid: bool) -> tuple[Source, CocoIndex]:
    with _progress(f"loading {path.name}") as update:
        source, index = load_for_writing(path, skip_invalid=skip_invalid, progress=update)
    _report_skipped(index)
    return source, index


def _report_skipped(index: CocoIndex) -> None:
    if index.skipped:
        first = index.skipped[0]
        click.echo(f"skipped {len(index.skipped)} invalid annotations (first: annotation "
                   f"#{first.position}: {first.reason})", err=True)


@click.group("coco")
def coco_group() -> None:
    """COCO instances files: class statistics, balanced subsets, stratified splits."""


_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_SKIP = click.option("--skip-invalid", is_flag=True,
                     help="Skip and count malformed annotations instead of failing.")


@coco_group.command("stats")
@click.argument("file", type=_FILE)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
@click.option("--sort", type=click.Choice(["id", "instances", "name"]), default="id", show_default=True)
@_SKIP
@friendly
def stats_command(file: Path, fmt: str, sort: str, skip_invalid: bool) -> None:
    """Per-class instances, images, crowd and share; imbalance ratio and entropy."""
    result = stats(_load(file, skip_invalid))
    rows = _sorted(result.classes, sort)
    if fmt == "json":
        data = {k: _finite(v) for k, v in result.to_dict().items()}
        data["classes"] = [vars(r) for r in rows]
        click.echo(json.dumps(data, indent=1, allow_nan=False))
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["id", "name", "instances", "images", "crowd", "share"])
        for r in rows:
            writer.writerow([r.id, r.name, r.instances, r.images, r.crowd, f"{r.share:.6f}"])
        click.echo(buf.getvalue(), nl=False)
    else:
        _stats_table(result, rows)


def _finite(value: Any) -> Any:
    """JSON has no infinity: an undefined ratio becomes null."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _sorted(rows: Sequence[ClassStats], key: str) -> list[ClassStats]:
    if key == "instances":
        return sorted(rows, key=lambda r: (-r.instances, r.id))
    if key == "name":
        return sorted(rows, key=lambda r: r.name)
    return list(rows)


def _ratio(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:,.1f}:1"


def _stats_table(result: DatasetStats, rows: list[ClassStats]) -> None:
    table = Table(title="Distribution of instances among all categories")
    for col in ("id", "category", "instances", "images", "crowd", "share"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for r in rows:
        table.add_row(str(r.id), r.name, f"{r.instances:,}", f"{r.images:,}", f"{r.crowd:,}",
                      f"{100 * r.share:.2f}%")
    out = _stdout()
    out.print(table)
    out.print(f"images: {result.num_images:,}  annotations: {result.num_annotations:,}  "
              f"images without annotations: {result.images_without_annotations:,}")
    out.print(f"max/min ratio: {_ratio(result.imbalance_ratio)}  normalised entropy: "
              f"{result.normalized_entropy:.3f}  classes without instances: {result.absent_classes}"
              + (f"  skipped annotations: {result.skipped_annotations}" if result.skipped_annotations else ""))


@coco_group.command("balance")
@click.argument("file", type=_FILE)
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the balanced COCO file.")
@click.option("--per-class", type=int, default=None, help="At most N instances of each class where possible.")
@click.option("--max-images", type=int, default=None, help="At most M images.")
@click.option("--target", type=click.Choice(list(TARGETS)), default="uniform",
              show_default=True, help="Target class distribution.")
@click.option("--min-per-class", type=int, default=None,
              help="Seed every class with min(its total, this) instances first "
                   "[default: 150 with --max-images alone, 0 with --per-class].")
@click.option("--seed", type=int, default=0, show_default=True)
@_SKIP
@friendly
def balance_command(file: Path, out: Path, per_class: int | None, max_images: int | None, target: str,
                    min_per_class: int | None, seed: int, skip_invalid: bool) -> None:
    """Write a class-balanced subset of FILE to OUT and print a before/after table."""
    with gc_paused():  # the parsed source stays alive until it is written
        source, index = _load_source(file, skip_invalid)
        with _progress("balancing") as update:
            result = balance(index, per_class=per_class, max_images=max_images,
                             target=cast(Target, target), seed=seed, min_per_class=min_per_class,
                             progress=update)
        with _progress(f"writing {out.name}") as update:
            update("writing", 0.1)
            write_subset(source, index, result.images, out)
    _balance_table(index, result)
    n_ann = int(result.after.sum())
    click.echo(f"wrote {out} ({result.num_images:,} images, {n_ann:,} annotations)")


def _balance_table(index: CocoIndex, result: BalanceResult) -> None:
    table = Table(title="Instances per class, before and after balancing")
    for col in ("category", "before", "share", "after", "share ", "target"):
        table.add_column(col, justify="left" if col == "category" else "right")
    b_tot, a_tot = max(1, int(result.before.sum())), max(1, int(result.after.sum()))
    for i in np.argsort(-result.before, kind="stable"):
        table.add_row(index.cat_names[i], f"{int(result.before[i]):,}", f"{100 * result.before[i] / b_tot:.2f}%",
                      f"{int(result.after[i]):,}", f"{100 * result.after[i] / a_tot:.2f}%",
                      f"{result.target[i]:,.0f}")
    out = _stdout()
    out.print(table)
    s = result.summary()
    out.print(f"images: {index.num_images:,} -> {result.num_images:,}  instances: "
              f"{int(s['before']['instances']):,} -> {int(s['after']['instances']):,}")
    out.print(f"max/min ratio: {_ratio(s['before']['imbalance_ratio'])} -> {_ratio(s['after']['imbalance_ratio'])}"
              f"  normalised entropy: {s['before']['normalized_entropy']:.3f} -> "
              f"{s['after']['normalized_entropy']:.3f}  largest share: "
              f"{100 * s['before']['max_share']:.1f}% -> {100 * s['after']['max_share']:.1f}%")


@coco_group.command("split")
@click.argument("file", type=_FILE)
@click.option("--val", type=float, required=True, help="Share of images in the val file, e.g. 0.1.")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for <stem>_train.json and <stem>_val.json (default: FILE's folder).")
@click.option("--seed", type=int, default=0, show_default=True)
@_SKIP
@friendly
def split_command(file: Path, val: float, out_dir: Path | None, seed: int, skip_invalid: bool) -> None:
    """Class-stratified train/val split of FILE (iterative stratification)."""
    with gc_paused():  # the parsed source stays alive until it is written
        source, index = _load_source(file, skip_invalid)
        result = stratified_split(index, val=val, seed=seed)
        folder = out_dir if out_dir is not None else file.parent
        folder.mkdir(parents=True, exist_ok=True)
        train_path, val_path = folder / f"{file.stem}_train.json", folder / f"{file.stem}_val.json"
        with _progress("writing split") as update:
            update("writing", 0.1)
            write_subsets(source, index, {train_path: result.train, val_path: result.val})
    _split_table(index, result)
    click.echo(f"wrote {train_path} ({len(result.train):,} images) and {val_path} "
               f"({len(result.val):,} images)")


def _split_table(index: CocoIndex, result: SplitResult) -> None:
    counts = []
    for part in (result.train, result.val):
        mask = np.zeros(index.num_images, dtype=bool)
        mask[part] = True
        counts.append(np.bincount(index.ann_category[mask[index.ann_image]], minlength=index.num_categories))
    table = Table(title="Instances per class in each split")
    for col in ("category", "train", "val", "val share"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for i in range(index.num_categories):
        tr, va = int(counts[0][i]), int(counts[1][i])
        share = f"{100 * va / (tr + va):.1f}%" if tr + va else "-"
        table.add_row(index.cat_names[i], f"{tr:,}", f"{va:,}", share)
    _stdout().print(table)
