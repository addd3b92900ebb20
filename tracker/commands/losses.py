"""``tracker weights`` (class-weight tables) and ``tracker check-plugins`` (conformance checks)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import click

from tracker.cli import friendly
from tracker.commands._output import print_rows
from tracker.errors import ConfigError
from tracker.weights import COUNT_SCHEMES, NORMALIZATIONS, SCHEMES, class_weights, load_counts


def _manual(raw: str | None) -> list[float] | None:
    if raw is None:
        return None
    try:
        return [float(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--weights is {raw!r}; expected comma-separated numbers such as 1,0.5,2") from None


def weight_rows(
    counts_path: str | None, scheme: str, beta: float, power: float, manual: str | None, normalize: str
) -> list[dict[str, Any]]:
    """Rows ``{"class", "count", "weight"}`` for the given counts file and scheme."""
    names: list[str] | None = None
    counts = None
    if counts_path is None and scheme in COUNT_SCHEMES | {"none"}:
        raise ConfigError(f"--scheme {scheme} needs --counts FILE (a JSON file of class counts)")
    if counts_path is not None:
        loaded = load_counts(counts_path)
        names, counts = loaded.names, loaded.counts
    weights = class_weights(counts, scheme, beta=beta, power=power, weights=_manual(manual), normalize=normalize)
    names = names or [str(i) for i in range(len(weights))]
    return [
        {"class": name, "count": None if counts is None else _number(counts[i]), "weight": float(weights[i])}
        for i, name in enumerate(names)
    ]


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def _print_weights(rows: list[dict[str, Any]], fmt: str, title: str) -> None:
    if fmt == "json":
        click.echo(json.dumps({"title": title, "classes": rows}, indent=1))
        return
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=["class", "count", "weight"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        click.echo(out.getvalue(), nl=False)
        return
    table_rows = [
        [row["class"], "" if row["count"] is None else f"{row['count']:,}", f"{row['weight']:.6g}"] for row in rows
    ]
    print_rows(("class", "count", "weight"), table_rows, title=title, keys=("class", "weight"))


FAILED_PLUGIN = "-"  # the term and backend columns of a plugin that registered nothing


def check_rows(report: Any, owners: dict[str, str], failures: dict[str, str]) -> list[list[str]]:
    """Rows (term, backend, plugin, checks, status): one per term and backend, one per failed plugin."""
    rows = []
    groups: dict[tuple[str, str], list[Any]] = {}
    for result in report.results:
        groups.setdefault((result.term, result.backend), []).append(result)
    for (term, backend), results in groups.items():
        failed = [r.check for r in results if r.status == "failed"]
        skipped = [r.message for r in results if r.status == "skipped"]
        status = "FAILED: " + ", ".join(failed) if failed else f"skipped: {skipped[0]}" if skipped else "ok"
        owner = owners.get(term if backend == "reference" else f"{term}/{backend}", "")
        rows.append([term, backend, owner, str(len(results)), status])
    for plugin, reason in sorted(failures.items()):
        rows.append([FAILED_PLUGIN, FAILED_PLUGIN, plugin, "load", f"FAILED: plugin disabled: {reason}"])
    return rows


def _status_style(column: str, value: str) -> str | None:
    if column != "status":
        return None
    return "red" if value.startswith("FAILED") else "yellow" if value.startswith("skipped") else "green"


def register(cli: click.Group) -> None:
    """Add ``weights`` and ``check-plugins`` to the CLI."""

    @cli.command("weights")
    @click.option(
        "--counts",
        "counts_path",
        type=click.Path(dir_okay=False),
        help="class counts: a COCO instances file, the COCO class-count file, {name: n} or a list",
    )
    @click.option("--scheme", type=click.Choice(SCHEMES), default="inverse", show_default=True)
    @click.option("--beta", type=float, default=0.999, show_default=True, help="effective_number beta")
    @click.option("--power", type=float, default=0.5, show_default=True, help="power scheme exponent p")
    @click.option("--weights", "manual", help="comma-separated weights for --scheme manual")
    @click.option("--normalize", type=click.Choice(NORMALIZATIONS), default="mean", show_default=True)
    @click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
    @friendly
    def weights_command(
        counts_path: str | None, scheme: str, beta: float, power: float, manual: str | None, normalize: str, fmt: str
    ) -> None:
        """Print per-class weights computed from class counts."""
        rows = weight_rows(counts_path, scheme, beta, power, manual, normalize)
        extra = {"effective_number": f", beta {beta}", "power": f", p {power}"}.get(scheme, "")
        _print_weights(rows, fmt, f"class weights: {scheme}{extra}, normalize {normalize}")

    @cli.command("check-plugins")
    @click.option("--term", "terms", multiple=True, help="check only this loss term (repeatable)")
    @click.option("--verbose", "-v", is_flag=True, help="list every check, passed ones too")
    @friendly
    def check_plugins_command(terms: tuple[str, ...], verbose: bool) -> None:
        """Run the conformance checks on every installed loss term and kernel."""
        from tracker.host import get_host
        from tracker.losses import get_term, kernels
        from tracker.testing.conformance import ConformanceReport, check_all, check_kernel, check_loss_term

        if terms:
            report = ConformanceReport()
            for name in terms:
                report.extend(check_loss_term(get_term(name), raise_on_failure=False))
                for backend in kernels(name):
                    report.extend(check_kernel(name, backend, raise_on_failure=False))
        else:
            report = check_all()
        host = get_host()
        failures = host.fill_all()
        owners = {**host.registry("losses").owners, **host.registry("kernels").owners}
        rows = check_rows(report, owners, failures)
        print_rows(
            ("term", "backend", "plugin", "checks", "status"), rows, title="Loss-term conformance",
            keys=("term", "backend", "plugin"), drop_order=("checks",), wrap=("status",),
            style=_status_style,
        )
        for result in report.results:
            if verbose or result.status == "failed":
                click.echo(result.message or f"{result.term}/{result.backend}: {result.check} {result.status}")
        for plugin, reason in sorted(failures.items()):
            click.echo(
                f"plugin {plugin!r} failed to load or register and was disabled: {reason}; "
                "its loss terms and kernels were not checked"
            )
        if not report.ok or failures:
            raise click.exceptions.Exit(1)
