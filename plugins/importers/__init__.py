"""Built-in plugin: importers of history for ``tracker import``.

Registers four sources through ``tracker_register_importers``: ``ultralytics``,
``tensorboard``, ``mlflow`` and ``csv``. Their optional libraries (``tensorboard``
for its compiled ``Event`` protos, ``mlflow-skinny``) are imported only when a
source is read; they come with the ``import`` extra.
"""

from __future__ import annotations

from typing import Any, Callable

from tracker import hookimpl
from plugins.importers.csvfile import CsvImporter
from plugins.importers.mlflow import MlflowImporter
from plugins.importers.tensorboard import TensorBoardImporter
from plugins.importers.ultralytics import UltralyticsImporter


@hookimpl
def tracker_register_importers(register: Callable[[Any], None]) -> None:
    """Register the Ultralytics, TensorBoard, MLflow and CSV importers."""
    for importer in (UltralyticsImporter(), TensorBoardImporter(), MlflowImporter(), CsvImporter()):
        register(importer)
