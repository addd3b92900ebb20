"""One error hierarchy for the whole suite.

Every message names the thing, the bad value and the fix, e.g.
``Unknown loss 'bce2'; available: class_weighted_bce, sigmoid_focal``.
"""

from __future__ import annotations


class TrackerError(Exception):
    """Base class of every error the suite raises on purpose."""


class PluginError(TrackerError):
    """A plugin failed to load, registered something invalid, or a duplicate."""


class RunError(TrackerError):
    """A run was used wrongly: unknown run to resume, finished run logged to, ..."""


class StoreError(TrackerError):
    """The DuckDB store could not be opened, migrated, or queried."""


class StoreLockedError(StoreError):
    """Another process held the store's file lock for longer than the bounded wait."""


class ConfigError(TrackerError):
    """A bad parameter value, with the name, the value and what is expected."""


class DataError(TrackerError):
    """Malformed input data (a COCO file, a counts file, a corrupt segment)."""


class StoreUnavailableError(StoreError):
    """The store's catalog server cannot be reached now (rows stay in the spool)."""
