"""Where notifications go and which events go there: targets, rules, masking.

A target is a string ``NAME:ARGUMENT``, ``NAME`` a registered notifier (optionally
``NAME+FLAVOR``, such as ``webhook+slack``)::

    webhook:https://example.com/hook       webhook+slack:${SLACK_WEBHOOK_URL}
    email:ops@example.com                  file:alerts.jsonl         console:

``${VAR}`` is read from the environment when a message is sent, never before: a
secret given that way is stored nowhere. Targets come from ``tracker.init(...,
notify=[...])``, else ``TRACKER_NOTIFY`` (comma-separated), else the
``[tool.tracker.notify]`` table of the project's ``pyproject.toml`` (``targets`` and
``rules``). A rule (a dict) picks events by ``kinds``, lowest ``severity`` and
``keys`` (shell patterns), for the targets named in ``to`` (default: all); the
default rule sends error-severity events only.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tracker.errors import ConfigError
from tracker.events import SEVERITIES

log = logging.getLogger(__name__)

ENV_TARGETS = "TRACKER_NOTIFY"
ENV_RATE = "TRACKER_NOTIFY_RATE_S"
DEFAULT_RATE_S = 600.0  # one message per rule and target per 10 minutes
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_URL_RE = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<auth>[^/@\s]*@)?(?P<host>[^/?#\s]*)(?P<rest>[^\s,'\"]*)",
                     re.IGNORECASE)


def mask(text: str) -> str:
    """``text`` with every URL's credentials, path and query replaced by ``***`` (they hold tokens)."""
    def one(m: re.Match[str]) -> str:
        auth = "***@" if m.group("auth") else ""
        rest = "/***" if m.group("rest") not in ("", "/") else m.group("rest")
        return f"{m.group('scheme')}{auth}{m.group('host')}{rest}"

    return _URL_RE.sub(one, text)


def expand(arg: str) -> str:
    """``arg`` with each ``${VAR}`` read from the environment (ConfigError naming a missing one)."""
    def one(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            raise ConfigError(f"notify target needs environment variable {m.group(1)}, which is not set; "
                              f"export {m.group(1)}=... in the environment of the process that sends")
        return value

    return _VAR_RE.sub(one, arg)


@dataclass(frozen=True)
class Target:
    """One place to send to: ``notifier`` (registered name), ``flavor`` and the raw ``arg``."""

    spec: str
    notifier: str
    flavor: str
    arg: str

    @property
    def shown(self) -> str:
        """The spec with URL tokens masked, for logs, errors and the UI."""
        return mask(self.spec)


def parse_target(spec: str) -> Target:
    """A :class:`Target` from ``NAME[+FLAVOR]:ARGUMENT`` (ConfigError naming a bad one)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"notify target {spec!r} is not a non-empty string; write NAME:ARGUMENT, "
                          "e.g. 'webhook:https://example.com/hook' or 'email:ops@example.com'")
    spec = spec.strip()
    head, sep, arg = spec.partition(":")
    name, _, flavor = head.partition("+")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name or "-") or (not sep and name != "console"):
        raise ConfigError(f"notify target {mask(spec)!r} is not NAME:ARGUMENT; write e.g. "
                          "'webhook:https://example.com/hook', 'email:ops@example.com' or 'console:'")
    return Target(spec=spec, notifier=name.lower(), flavor=flavor.lower(), arg=arg)


@dataclass(frozen=True)
class Rule:
    """Which events go to which targets."""

    name: str
    kinds: tuple[str, ...] = ()
    severity: str = "error"
    keys: tuple[str, ...] = ()
    to: tuple[str, ...] = ()  # target specs or notifier names; empty: every target

    def matches(self, kind: str, severity: str, key: str | None) -> bool:
        """Does an event of ``kind``/``severity`` on ``key`` pass this rule?"""
        if SEVERITIES.index(severity) < SEVERITIES.index(self.severity):
            return False
        if self.kinds and kind not in self.kinds and "*" not in self.kinds:
            return False
        if self.keys and not any(fnmatch.fnmatchcase(key or "", p) for p in self.keys):
            return False
        return True

    def sends_to(self, target: Target) -> bool:
        return not self.to or target.spec in self.to or target.notifier in self.to


DEFAULT_RULE = Rule(name="default")


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"notify rule {what} is {value!r}; expected a string or a list of strings")


def parse_rule(raw: Mapping[str, Any], index: int) -> Rule:
    """A :class:`Rule` from a dict with ``kinds``, ``severity``, ``keys``, ``to`` and ``name``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"notify rule {index} is {raw!r}; expected a table/dict with kinds, severity, keys, to")
    unknown = sorted(set(raw) - {"name", "kinds", "severity", "keys", "to"})
    if unknown:
        raise ConfigError(f"notify rule {index} has unknown field(s) {unknown}; known: name, kinds, severity, keys, to")
    severity = raw.get("severity", "error")
    if severity not in SEVERITIES:
        raise ConfigError(f"notify rule {index}: severity {severity!r} is not one of {', '.join(SEVERITIES)}")
    return Rule(name=str(raw.get("name", f"rule{index}")), kinds=_strings(raw.get("kinds"), "kinds"),
                severity=severity, keys=_strings(raw.get("keys"), "keys"), to=_strings(raw.get("to"), "to"))


@dataclass
class NotifyConfig:
    """Targets, rules and the rate limit of one run (or of ``tracker notify``)."""

    targets: list[Target] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=lambda: [DEFAULT_RULE])
    rate_s: float = DEFAULT_RATE_S
    source: str = "none"

    def specs(self) -> list[str]:
        return [t.spec for t in self.targets]


def _rate() -> float:
    raw = os.environ.get(ENV_RATE)
    if raw is None or raw == "":
        return DEFAULT_RATE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"{ENV_RATE}={raw!r} is not a number of seconds >= 0; e.g. {ENV_RATE}=600")
    return value


def _pyproject_table(start: Path) -> tuple[dict[str, Any], Path | None]:
    """The ``[tool.tracker.notify]`` table of the nearest ``pyproject.toml`` at or above ``start``."""
    import tomllib

    for folder in (start, *start.parents):
        path = folder / "pyproject.toml"
        if path.is_file():
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError) as exc:  # someone else's file: never stop a run for it
                log.warning("tracker: %s is not readable TOML (%s); its [tool.tracker.notify] is ignored", path, exc)
                return {}, None
            table = data.get("tool", {}).get("tracker", {}).get("notify")
            return (table if isinstance(table, dict) else {}), path
    return {}, None


def load(notify: Iterable[Any] | None = None, cwd: str | os.PathLike[str] | None = None) -> NotifyConfig:
    """The notify configuration: ``notify`` given, else ``TRACKER_NOTIFY``, else pyproject.toml.

    ``notify`` items are target strings, or rule dicts (``{"to": ..., "kinds": ..., ...}``).
    ``notify=[]`` turns notifications off whatever the environment says.
    """
    rules_raw: list[Any] = []
    if notify is not None:
        if isinstance(notify, str):
            notify = [notify]
        items, source = list(notify), "init(notify=...)"
    elif os.environ.get(ENV_TARGETS, "").strip():
        items, source = [s for s in os.environ[ENV_TARGETS].split(",") if s.strip()], ENV_TARGETS
    else:
        table, path = _pyproject_table(Path(cwd or os.getcwd()).resolve())
        items = list(_strings(table.get("targets"), "targets")) if table else []
        rules_raw = list(table.get("rules") or []) if table else []
        source = f"{path} [tool.tracker.notify]" if table else "none"
    targets: list[Target] = []
    for item in items:
        if isinstance(item, Mapping):
            rules_raw.append(item)
            for spec in _strings(item.get("to"), "to"):
                if ":" in spec and spec not in {t.spec for t in targets}:
                    targets.append(parse_target(spec))
        else:
            target = parse_target(item)
            if target.spec not in {t.spec for t in targets}:
                targets.append(target)
    rules = [parse_rule(r, i) for i, r in enumerate(rules_raw)] or [DEFAULT_RULE]
    return NotifyConfig(targets=targets, rules=rules, rate_s=_rate(), source=source)


def to_json(cfg: NotifyConfig) -> dict[str, Any]:
    """What the spool keeps so another process can deliver (specs as written: ``${VAR}`` unexpanded)."""
    return {
        "targets": cfg.specs(),
        "rules": [{"name": r.name, "kinds": list(r.kinds), "severity": r.severity, "keys": list(r.keys),
                   "to": list(r.to)} for r in cfg.rules],
        "rate_s": cfg.rate_s,
    }


def from_json(raw: Mapping[str, Any]) -> NotifyConfig:
    """The inverse of :func:`to_json`."""
    return NotifyConfig(targets=[parse_target(s) for s in raw.get("targets", [])],
                        rules=[parse_rule(r, i) for i, r in enumerate(raw.get("rules", []))] or [DEFAULT_RULE],
                        rate_s=float(raw.get("rate_s", DEFAULT_RATE_S)), source="spool")


def check_targets(targets: Sequence[Target], available: Mapping[str, Any]) -> None:
    """ConfigError naming a target whose notifier is not registered, or whose argument it refuses."""
    for target in targets:
        notifier = available.get(target.notifier)
        if notifier is None:
            raise ConfigError(f"notify target {target.shown!r}: unknown notifier {target.notifier!r}; "
                              f"available: {', '.join(sorted(available)) or 'none'}")
        check = getattr(notifier, "check", None)
        if callable(check):
            check(target)
