"""Loss analysis: detectors for divergence, non-finite values, spikes, plateaus,
stagnant classes and rank disagreement, online (the run's flusher) and offline.

``tracker.analyze(run_id, key=None, home=None, **overrides)`` returns an
:class:`~tracker.analysis.report.Analysis` (``.to_dict()`` for JSON): a verdict per
loss key with its trend statistic, the events and the stagnant classes. Modules:
:mod:`~tracker.analysis.smoothing` (debiased EMA, robust scales),
:mod:`~tracker.analysis.trend` (Mann–Kendall, Sen's slope),
:mod:`~tracker.analysis.detectors` / :mod:`~tracker.analysis.classes` /
:mod:`~tracker.analysis.ranks` (the streams), :mod:`~tracker.analysis.builtin`
(the registered specs and their defaults), :mod:`~tracker.analysis.online`
(the flusher's analyzer), :mod:`~tracker.analysis.offline` (reading a run from the
store) and :mod:`~tracker.analysis.corpus` (the labelled curves);
:mod:`~tracker.analysis.system` holds the detectors of the ``sys/*`` keys (memory
growth, fragmentation, step-time regression, data-loader stall) and
:mod:`~tracker.analysis.system_corpus` their labelled runs.
"""

from __future__ import annotations

from tracker.analysis.detectors import Chunk, DetectorSpec, StreamContext
from tracker.analysis.offline import analyze, save_events
from tracker.analysis.online import OnlineAnalyzer, make_online_analyzer
from tracker.analysis.params import Param
from tracker.analysis.report import Analysis, EventRecord, KeyReport, StagnantReport

__all__ = [
    "Analysis",
    "Chunk",
    "DetectorSpec",
    "EventRecord",
    "KeyReport",
    "OnlineAnalyzer",
    "Param",
    "StagnantReport",
    "StreamContext",
    "analyze",
    "make_online_analyzer",
    "save_events",
]
