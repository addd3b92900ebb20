"""Rank and world size of this process: torch.distributed when initialised, else RANK/WORLD_SIZE."""

from __future__ import annotations

import os
import sys


def rank_world() -> tuple[int, int]:
    """Return ``(rank, world_size)``; ``(0, 1)`` outside distributed training."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size())
        except Exception:  # pragma: no cover - a broken torch install
            pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        from tracker.errors import ConfigError

        raise ConfigError(
            f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} "
            "must be integers; unset them or fix the launcher"
        ) from None
