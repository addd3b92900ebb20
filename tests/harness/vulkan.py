"""What the Vulkan validation layer says: the ``gpu.validation`` log messages collected in a block."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def collect_validation_messages() -> Iterator[list[str]]:
    """The messages (WARNING and above) the validation layer logs inside the block, as a live list."""
    collector = _Collector()
    logger = logging.getLogger("gpu.validation")
    logger.addHandler(collector)
    try:
        yield collector.messages
    finally:
        logger.removeHandler(collector)
