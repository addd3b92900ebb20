"""Alerts and actions: notifiers, rules, the crash-safe outbox, the heartbeat check.

See docs/alerts.md. Submodules load on first use (``import tracker`` stays light):
:mod:`tracker.notify.config` (targets, rules, masking), :mod:`tracker.notify.outbox`
(the spool's queue), :mod:`tracker.notify.dispatch` (a run's notifier thread),
:mod:`tracker.notify.recovery` (what dead runs left, crashed runs).
"""

from __future__ import annotations
