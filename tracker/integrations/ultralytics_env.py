"""A private, offline Ultralytics configuration folder.

Measured with ultralytics 8.4.190: ``import ultralytics`` probes DNS unless
``YOLO_OFFLINE=1``; dataset checks call ``check_font("Arial.ttf")``, which sends
an HTTP HEAD request unless the font is already in ``$YOLO_CONFIG_DIR/Ultralytics/``;
its ClearML, Comet, DVC, MLflow and Ray Tune callbacks are on by default, and its
usage analytics follow the ``sync`` setting.

:func:`offline_config` prepares such a folder (settings with every integration
and ``sync`` off, a font copied from matplotlib, which Ultralytics depends on)
and returns the environment variables that point Ultralytics, and matplotlib's
font cache, at it. It never touches the user's own settings file. The variables
must be in the environment before ``ultralytics`` is first imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from tracker.errors import ConfigError

SETTINGS_VERSION = "0.0.8"
INTEGRATIONS_OFF = {"clearml": False, "comet": False, "dvc": False, "mlflow": False, "raytune": False,
                    "tensorboard": False, "wandb": False, "sync": False}
FONTS = ("Arial.ttf", "Arial.Unicode.ttf")


def _font_source() -> Path:
    """matplotlib's DejaVuSans.ttf, found without importing matplotlib (which would create its config dir)."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("matplotlib is not installed; install the 'ultralytics' extra (it depends on matplotlib)")
    font = Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not font.is_file():
        raise ConfigError(f"matplotlib's DejaVuSans.ttf is missing at {str(font)!r}; reinstall matplotlib")
    return font


def offline_config(config_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Write an offline Ultralytics configuration under ``config_dir``; return the env vars to set.

    ``{"YOLO_CONFIG_DIR": ..., "YOLO_OFFLINE": "1", "MPLCONFIGDIR": ...}``; apply them
    with :func:`apply_env` (or to a child process's environment).
    """
    root = Path(config_dir).resolve()
    folder = root / "Ultralytics"
    folder.mkdir(parents=True, exist_ok=True)
    font = _font_source()
    for name in FONTS:
        if not (folder / name).exists():
            shutil.copyfile(font, folder / name)
    settings = {
        "settings_version": SETTINGS_VERSION,
        "datasets_dir": str(root / "datasets"),
        "weights_dir": str(root / "weights"),
        "runs_dir": str(root / "runs"),
        "uuid": hashlib.sha256(str(root).encode()).hexdigest(),
        "api_key": "",
        "openai_api_key": "",
        "vscode_msg": False,
        "openvino_msg": False,
        **INTEGRATIONS_OFF,
    }
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    (root / "matplotlib").mkdir(exist_ok=True)
    return {"YOLO_CONFIG_DIR": str(root), "YOLO_OFFLINE": "1", "MPLCONFIGDIR": str(root / "matplotlib")}


def apply_env(env: dict[str, str]) -> None:
    """Set ``env`` in this process; refuse when Ultralytics was already imported with another folder."""
    loaded = sys.modules.get("ultralytics.utils")
    if loaded is not None:
        current = Path(str(getattr(loaded, "USER_CONFIG_DIR", ""))).parent
        if current != Path(env["YOLO_CONFIG_DIR"]) or not os.environ.get("YOLO_OFFLINE"):
            raise ConfigError(
                f"ultralytics was imported before its configuration folder was set (it uses {str(current)!r}); "
                "call offline_config() and apply_env() before the first 'import ultralytics'"
            )
    os.environ.update(env)
