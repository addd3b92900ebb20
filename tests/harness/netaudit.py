"""Watch a process for network use with an audit hook (PEP 578), and give a child process
the Ultralytics configuration a user has by default.

:func:`install` adds a ``sys.addaudithook`` hook that records every name lookup
(``socket.getaddrinfo``, ``socket.gethostbyname``, ...) and every connection or datagram
(``socket.connect``, ``socket.sendto``, ...) to a host other than localhost in a file, one
line each, and makes it fail (``OSError``), so nothing leaves the machine even where a
network is reachable. Unix sockets and localhost are allowed. An audit hook sees calls
that bypass the ``socket`` module's Python functions (C extensions calling through
``socket`` objects, ``requests``/``urllib3``, threads started by libraries), which
monkey-patching ``socket`` would miss.

:func:`user_env` is the environment of a child that behaves as on a user's machine: the
CI and pytest markers that make Ultralytics and MLflow stay quiet in tests are removed,
and Ultralytics reads a settings file with its own defaults (MLflow, ClearML, Comet, DVC
and Ray Tune callbacks on, ``sync`` on). ``YOLO_OFFLINE=1`` and a font in the folder
stop Ultralytics' own probes at import and dataset check (see
:mod:`tracker.integrations.ultralytics_env`): what is left is what the training does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

LOOKUPS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr",
           "socket.getnameinfo")
SENDS = ("socket.connect", "socket.sendto", "socket.sendmsg")
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "", None})
# Ultralytics 8.4.190's SettingsManager defaults for the integrations
ULTRALYTICS_DEFAULTS = {"clearml": True, "comet": True, "dvc": True, "mlflow": True, "raytune": True,
                        "tensorboard": False, "wandb": False, "sync": True}
# variables that make Ultralytics (TESTS_RUNNING) or MLflow (telemetry) behave as under a test
TEST_MARKERS = ("PYTEST_CURRENT_TEST", "PYTEST_VERSION", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI",
                "JENKINS_URL", "TRAVIS", "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE",
                "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION", "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME",
                "RUNBOT_WORKER_ID", "MLFLOW_TRACKING_URI", "DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY")


def _local(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    return host in LOCAL_NAMES or (isinstance(host, str) and host.startswith("127."))


def _caller() -> str:
    """`` from FILE:LINE in FUNCTION`` for the innermost frames outside the standard library."""
    import sysconfig
    import traceback

    stdlib = sysconfig.get_paths()["stdlib"]
    frames = [f for f in traceback.extract_stack()[:-2] if not f.filename.startswith(stdlib)]
    return "".join(f" from {f.filename}:{f.lineno} in {f.name}" for f in frames[-6:][::-1])


def install(record: str | os.PathLike[str], where: bool = False) -> None:
    """Record (and refuse) every non-local name lookup and connection of this process in ``record``
    (with ``where``, followed by the innermost calls outside the standard library that made it)."""
    path = str(record)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in LOOKUPS:
            target = args[0] if args else None
        elif event in SENDS:
            sock, address = (args[0], args[1]) if len(args) >= 2 else (None, None)
            if isinstance(address, (str, bytes)) or getattr(sock, "family", None) == getattr(
                    sys.modules.get("socket"), "AF_UNIX", -1):
                return  # a Unix socket
            target = address[0] if isinstance(address, tuple) and address else address
        else:
            return
        if _local(target):
            return
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{event} {target!r}{_caller() if where else ''}\n")
        raise OSError(f"network use refused by the audit hook: {event} {target!r}")

    sys.addaudithook(hook)


def user_env(config_dir: str | os.PathLike[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) made to look like a user's machine (module doc), with an
    Ultralytics configuration folder at ``config_dir`` holding Ultralytics' default settings."""
    from tracker.integrations.ultralytics_env import offline_config

    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in TEST_MARKERS}
    env.update(offline_config(config_dir))
    settings = Path(env["YOLO_CONFIG_DIR"]) / "Ultralytics" / "settings.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), **ULTRALYTICS_DEFAULTS}, indent=2))
    return env


def settings_file(env: dict[str, str]) -> Path:
    """The Ultralytics settings file a child with ``env`` reads."""
    return Path(env["YOLO_CONFIG_DIR"]) / "Ultralytics" / "settings.json"
