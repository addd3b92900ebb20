"""run.log_embeddings: the statistics, the rolling window, the worker, and the collapse detector."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest

import tracker
from tracker.analysis.collapse import COLLAPSE, FEED_FLAG, Collapse, collapse_events
from tracker.analysis.detectors import Chunk, StreamContext
from tracker.embedding_window import Window, rankme, statistics
from tracker.embeddings import wait
from tracker.errors import ConfigError, RunError


def _rankme_by_svd(z: np.ndarray) -> float:
    s = np.linalg.svd(z.astype(np.float64), compute_uv=False)
    p = s / s.sum() + 1e-7
    return float(np.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("shape", [(600, 16), (40, 64)])  # more samples than dimensions, and fewer
def test_statistics_match_their_definitions(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    z = (rng.normal(size=shape) * rng.uniform(0.2, 2.0, size=shape[1])).astype(np.float32)
    got = statistics(z, gamma=1.0)
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    assert got["rankme"] == pytest.approx(_rankme_by_svd(z), rel=1e-5)
    assert got["std"] == pytest.approx(float(u.std(axis=0, ddof=1).mean()), rel=1e-5)
    assert got["dead_dims"] == float(np.mean(z.std(axis=0, ddof=1) < 1.0))
    halves = statistics([z[: shape[0] // 3], z[shape[0] // 3 :]], gamma=1.0)  # a ring buffer's two slices
    assert halves == pytest.approx(got, rel=1e-6)


def test_statistics_of_healthy_and_collapsed_embeddings() -> None:
    rng = np.random.default_rng(1)
    d = 64
    healthy = statistics(rng.normal(size=(4096, d)).astype(np.float32))
    point = statistics((np.ones(d) + 1e-4 * rng.normal(size=(4096, d))).astype(np.float32))
    line = statistics(np.outer(rng.normal(size=4096), rng.normal(size=d)).astype(np.float32))
    assert healthy["std"] * math.sqrt(d) == pytest.approx(1.0, abs=0.02)  # SimSiam: about 1/sqrt(d)
    assert healthy["rankme"] > 0.9 * d and healthy["dead_dims"] < 0.7
    assert point["std"] * math.sqrt(d) < 1e-3 and point["dead_dims"] == 1.0
    assert line["rankme"] < 1.01 and rankme(np.zeros(3)) == 1.0


def test_the_ring_keeps_the_newest_samples_and_forgets_the_ones_dropped_unread() -> None:
    state = Window(key="z", dim=2, window=5, gamma=1.0, every=1)
    for i in range(7):
        state.add(np.full((1, 2), float(i), dtype=np.float32))
    assert sorted(np.concatenate(state.blocks())[:, 0]) == [2, 3, 4, 5, 6]
    state.skip(3)  # three newer rows were dropped: the three oldest would have left the window
    assert sorted(np.concatenate(state.blocks())[:, 0]) == [5, 6]
    state.add(np.array([[1.0, np.nan], [9.0, 9.0]], dtype=np.float32))
    assert sorted(np.concatenate(state.blocks())[:, 0]) == [5, 6, 9] and state.non_finite == 1


def _collapsing(step: int, d: int, rng: np.random.Generator) -> np.ndarray:
    f = min(1.0, max(0.0, (step - 60) / 40))  # healthy, then falling to one point from step 60
    return (rng.normal(size=(128, d)) * (1 - f) + 3.0 * f + 1e-3 * rng.normal(size=(128, d))).astype(np.float32)


def test_log_embeddings_logs_the_statistics_and_the_collapse_event() -> None:
    rng = np.random.default_rng(2)
    run = tracker.init("emb")
    for step in range(160):
        run.log({"loss": 1.0}, step=step)
        run.log_embeddings("proj", _collapsing(step, 32, rng), step=step, window=1024, every=256)
        assert wait(run)  # a training step takes longer than an evaluation; this loop does not
    run.finish()
    curves = tracker.query("SELECT key, step, value FROM curves WHERE key LIKE 'proj/%' ORDER BY key, step")
    assert set(curves["key"]) == {"proj/rankme", "proj/std", "proj/dead_dims"}
    std = curves.filter(curves["key"] == "proj/std")
    assert std["step"].to_list() == list(range(1, 160, 2))  # 256 samples in at step 1, then every other step
    events = tracker.query("SELECT step, key, message, data FROM events WHERE kind = 'collapse' ORDER BY step")
    std_events = events.filter(events["key"] == "proj/std")
    low = (std["value"].to_numpy() * math.sqrt(32) < 0.3).astype(int)  # below 0.3 x 1/sqrt(d), patience 3
    third = int(np.flatnonzero(np.convolve(low, np.ones(3, dtype=int))[: low.size] == 3)[0])
    assert std_events["step"].to_list() == [std["step"][third]] and 60 < std["step"][third] < 130
    assert "What to do" in std_events["message"][0] and "stop-gradient" in std_events["message"][0]
    config = tracker.query("SELECT config FROM runs")["config"][0]
    assert '"tracker_embeddings": {"proj": {"dim": 32, "window": 1024, "gamma": 1.0, "every": 256}}' in config
    assert run._embeddings.evaluations == std.height
    offline = collapse_events(run.run_id)
    assert [(e.step, e.key) for e in offline] == list(zip(events["step"], events["key"]))


def test_the_training_thread_only_copies() -> None:
    run = tracker.init("emb")
    z = np.ones((8, 4), dtype=np.float32)
    run.log_embeddings("z", z, step=0)
    z[:] = 5.0  # the caller reuses its buffer: the queued copy is unaffected
    monitor = run._embeddings
    queued = [item[1] for item in monitor._slots["z"].queue] or [None]
    assert monitor._thread is not None and monitor._thread is not threading.current_thread()
    run.finish()
    assert all(c is None or float(np.asarray(c).max()) == 1.0 for c in queued)


def test_bad_calls_name_the_problem() -> None:
    run = tracker.init("emb")
    with pytest.raises(ConfigError, match=r"'z' has shape \(4,\); expected \(N, D\)"):
        run.log_embeddings("z", np.ones(4))
    run.log_embeddings("z", np.ones((3, 4)), window=64)
    with pytest.raises(ConfigError, match="dimension 5; earlier calls had 4"):
        run.log_embeddings("z", np.ones((3, 5)))
    with pytest.raises(ConfigError, match="window=128 for 'z', whose settings its first call fixed"):
        run.log_embeddings("z", np.ones((3, 4)), window=128)
    with pytest.raises(ConfigError, match="window is 1; expected a value >= 2"):
        run.log_embeddings("w", np.ones((3, 4)), window=1)
    with pytest.raises(TypeError, match="non-empty str"):
        run.log_embeddings("", np.ones((3, 4)))
    run.finish()
    with pytest.raises(RunError, match="is finished"):
        run.log_embeddings("z", np.ones((3, 4)))


def test_the_collapse_detector_can_be_tuned_or_turned_off() -> None:
    rng = np.random.default_rng(3)
    for config in ({"analysis": {"collapse": False}}, {"analysis": False}):
        run = tracker.init("emb", config=config)
        for step in range(140):
            run.log_embeddings("proj", _collapsing(step, 16, rng), step=step, window=512, every=256)
        run.finish()
        assert tracker.query("SELECT count(*) AS n FROM events WHERE run_id = ?", [run.run_id])["n"][0] == 0
        assert tracker.query("SELECT count(*) AS n FROM curves WHERE run_id = ?", [run.run_id])["n"][0] > 0


def _stream(key: str, dim: int = 16, fed: bool = True, **params: float) -> Collapse:
    config = {"tracker_embeddings": {"proj": {"dim": dim}}, **({FEED_FLAG: True} if fed else {})}
    return Collapse(StreamContext(key=key, params={**COLLAPSE.defaults(), **params}, config=config))


def test_collapse_streams_give_the_same_events_whatever_the_chunking() -> None:
    steps = np.arange(200, dtype=np.int64)
    std = np.where(steps < 80, 0.24, np.maximum(0.01, 0.24 - (steps - 80) * 0.004))
    std[150:] = 0.24  # recovers, then collapses again
    std[180:] = 0.01
    whole = _stream("proj/std").feed(Chunk(steps, std))
    pieces = _stream("proj/std")
    one_by_one = [e for i in range(200) for e in pieces.feed(Chunk(steps[i : i + 1], std[i : i + 1]))]
    assert [(e.step, e.message) for e in whole] == [(e.step, e.message) for e in one_by_one]
    # below 0.3 / sqrt(16) = 0.075 from step 122 (0.24 - 42 * 0.004), three points in a row; then again
    assert [e.step for e in whole] == [124, 182]
    assert whole[0].data["statistic"] == "std" and whole[0].data["dim"] == 16


def test_collapse_streams_judge_only_fed_statistics() -> None:
    falling = Chunk(np.arange(50, dtype=np.int64), np.linspace(1.0, 0.0, 50))
    assert _stream("proj/std", fed=False).feed(falling) == []  # the run's own loss analysis: inert
    assert _stream("loss/std").feed(falling) == []  # not a declared embedding key
    assert _stream("proj/loss").feed(falling) == []
    falling_rank = Chunk(np.arange(20, dtype=np.int64), np.r_[np.full(10, 14.0), np.ones(10)])  # below 0.05 x 64
    rank = _stream("proj/rankme", dim=64).feed(falling_rank)
    assert [e.data["statistic"] for e in rank] == ["rankme"] and "dimensional collapse" in rank[0].message
    dead = _stream("proj/dead_dims").feed(Chunk(np.arange(20, dtype=np.int64), np.r_[np.zeros(10), np.ones(10)]))
    assert [e.step for e in dead] == [12]
    high_from_the_start = _stream("proj/dead_dims").feed(Chunk(np.arange(20, dtype=np.int64), np.ones(20)))
    assert high_from_the_start == []


def test_the_window_sums_follow_the_rows_in_and_out() -> None:
    rng = np.random.default_rng(4)
    state = Window(key="z", dim=8, window=100, gamma=0.5, every=1)
    for n in (30, 50, 45, 7, 100, 3):  # fills, wraps, evicts, replaces whole
        state.add((rng.normal(size=(n, 8)) * rng.uniform(0.1, 2, 8)).astype(np.float32))
        got, exact = state.evaluate(), statistics(state.blocks(), gamma=0.5)
        assert got == pytest.approx(exact, rel=1e-9)
    state.skip(60)
    assert state.filled == 40 and state.evaluate() == pytest.approx(statistics(state.blocks(), gamma=0.5), rel=1e-9)


def test_finish_waits_for_the_worker_at_most_half_the_logger_timeout(caplog: pytest.LogCaptureFixture) -> None:
    import time

    run = tracker.init("emb", config={"tracker_logger_timeout": 1.0})
    z = np.random.default_rng(5).normal(size=(512, 512)).astype(np.float32)
    for step in range(60):  # a backlog far larger than what the worker can take in 0.5 s here
        run.log_embeddings("big", z, step=step, every=512)
    t0 = time.perf_counter()
    run.finish()
    assert time.perf_counter() - t0 < 1.0 + 2.0  # half the timeout for the worker, then the usual finish
    time.sleep(0.5)  # the abandoned worker stops without logging into the finished run
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    assert run._embeddings._abandoned or run._embeddings.evaluations > 0


def test_a_warm_call_reuses_a_buffer_and_other_shapes_and_dtypes_still_go_in() -> None:
    import torch

    run = tracker.init("emb")
    layer = torch.nn.Linear(4, 8)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    for step in range(4):
        run.log_embeddings("z", layer(x).detach().numpy(), step=step, window=64, every=16)  # copied
    assert wait(run)
    slot = run._embeddings._slots["z"]
    free = {id(b) for b in slot.free}
    assert len(free) == 4  # the worker gave every buffer back
    z = layer(x).detach().numpy()
    run.log_embeddings("z", z, step=4)
    step, buf, rows, _ = slot.queue[-1]
    assert id(buf) in free and rows == 16 and np.array_equal(buf, z)  # a warm call allocates nothing
    assert wait(run)  # its own evaluation (a worker that finds more due batches at once evaluates the newest)
    run.log_embeddings("z", layer(x[:3]).double(), step=5)  # a smaller last batch, another dtype
    run.log_embeddings("z", x @ torch.ones(4, 8), step=6)
    assert wait(run)
    with pytest.raises(ConfigError, match="'z' has dtype complex128; expected real numbers"):
        run.log_embeddings("z", np.ones((3, 8), dtype=complex), step=7)
    run.finish()
    assert run._embeddings.keys["z"].filled == 64 and run._embeddings.keys["z"].since == 0
    stored = tracker.query("SELECT step FROM curves WHERE key = 'z/std' ORDER BY step")["step"].to_list()
    assert stored == [3, 4, 6]  # a full window (64 samples) at step 3, then each 16 new ones: 16 at 4, 3 + 16 at 6


def test_a_host_tensor_is_queued_as_is_and_one_written_in_place_is_left_out_then_copied(
        caplog: pytest.LogCaptureFixture) -> None:
    import torch

    run = tracker.init("emb")
    layer = torch.nn.Linear(4, 8)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 4, generator=gen) for _ in range(7)]
    z = layer(xs[0])
    run.log_embeddings("z", z, step=0, window=64, every=16)  # needs 64 rows before the worker takes any
    slot = run._embeddings._slots["z"]
    _, (held, version), rows, _ = slot.queue[-1]
    assert held.data_ptr() == z.data_ptr() and not held.requires_grad and rows == 16  # no copy, no graph
    assert slot.by_ref and not slot.free and version == z._version
    z1 = layer(xs[1])
    run.log_embeddings("z", z1, step=1)
    with torch.no_grad():
        z1.mul_(0.0)  # the training writes it in place before the worker read it
    for step in range(2, 6):
        run.log_embeddings("z", layer(xs[step]), step=step)
    assert wait(run)
    assert slot.changed == 16 and not slot.share and "written in place" in caplog.text
    z6 = layer(xs[6])
    run.log_embeddings("z", z6, step=6)  # from now on copied at the call
    _, buf, _, _ = slot.queue[-1]
    assert isinstance(buf, torch.Tensor) and buf.data_ptr() != z6.data_ptr() and not slot.by_ref
    with torch.no_grad():
        z6.mul_(0.0)  # no longer matters
    assert wait(run)
    run.finish()
    at = tracker.query("SELECT key, value FROM curves WHERE key LIKE 'z/%' AND step = 6")
    expected = statistics(torch.cat([layer(xs[i]) for i in range(3, 7)]).detach().numpy())  # z1 never went in
    assert dict(zip((k.split("/", 1)[1] for k in at["key"]), at["value"])) == pytest.approx(expected, rel=1e-6)


def test_a_view_is_shared_only_when_its_storage_is_at_most_twice_its_size() -> None:
    import torch

    run = tracker.init("emb")
    both = torch.randn(32, 8)
    first, _ = both.chunk(2)  # the two views' halves of one projector output
    run.log_embeddings("half", first, step=0)
    assert run._embeddings._slots["half"].by_ref
    wide = torch.randn(16, 64)
    run.log_embeddings("slice", wide[:, :8], step=0)  # a slice of something 8 times larger: copied
    slot = run._embeddings._slots["slice"]
    _, buf, _, _ = slot.queue[-1]
    assert not slot.by_ref and buf.untyped_storage().nbytes() == 16 * 8 * 4 and torch.equal(buf, wide[:, :8])
    run.log_embeddings("half", both[:16].clone(), step=1)  # a same-shaped tensor that is its own: shared
    assert type(run._embeddings._slots["half"].queue[-1][1]) is tuple
    run.log_embeddings("half", wide[:16, :8], step=2)  # a large base on the warm path: copied, not shared
    assert isinstance(run._embeddings._slots["half"].queue[-1][1], torch.Tensor)
    run.finish()


def test_a_warm_call_takes_the_bound_fast_path_and_anything_else_the_checked_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker.embeddings import EmbeddingMonitor

    run = tracker.init("emb")
    z = np.ones((8, 4), dtype=np.float32)
    run.log({"loss": 1.0}, step=5)
    run.log_embeddings("z", z, step=0)
    checked: list[str] = []
    prepare = EmbeddingMonitor._prepare
    monkeypatch.setattr(EmbeddingMonitor, "_prepare",
                        lambda self, key, *a: checked.append(key) or prepare(self, key, *a))
    slot = run._embeddings._slots["z"]
    run.log_embeddings("z", z * 2, step=1)
    run.log_embeddings("z", z * 3)  # no step: the run's last step
    assert checked == [] and [(s, float(b.max())) for s, b, _, _ in list(slot.queue)[-2:]] == [(1, 2.0), (5, 3.0)]
    run.log_embeddings("z", z, step=np.int64(6))  # not a plain int: checked, then queued
    run.log_embeddings("z", z.astype(np.float64), step=7)  # another dtype: checked, a new fast path bound
    run.log_embeddings("z", z.astype(np.float64), step=8)
    assert checked == ["z", "z"] and slot.dtype == np.float64 and slot.queue[-1][0] == 8
    with pytest.raises(TypeError, match="non-empty str"):
        run.log_embeddings(["z"], z)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step must be a non-negative int"):
        run.log_embeddings("z", z.astype(np.float64), step=-1)
    run.finish()
    with pytest.raises(RunError, match="is finished"):
        run.log_embeddings("z", z.astype(np.float64), step=9)  # the fast path declines once closed
    assert wait(run) and slot.submitted == 6 * 8


def test_statistics_land_on_the_window_that_ends_at_their_step_whatever_the_pace() -> None:
    rng = np.random.default_rng(6)
    batches = [(rng.normal(size=(64, 16)) * rng.uniform(0.3, 2.0, 16)).astype(np.float32) for _ in range(90)]
    run = tracker.init("emb")
    for step, z in enumerate(batches):  # far faster than the worker looks: it finds several due batches at once
        run.log_embeddings("z", z, step=step, window=4096, every=256)
    assert wait(run)
    run.finish()
    stored = tracker.query("SELECT step, key, value FROM curves WHERE key LIKE 'z/%' ORDER BY step")
    steps = sorted(set(stored["step"].to_list()))
    assert steps and run._embeddings.evaluations == len(steps) and run._embeddings.dropped_rows == 0
    assert all(b - a >= 256 // 64 for a, b in zip(steps, steps[1:]))  # at most one evaluation per `every` samples
    assert 64 * (steps[0] + 1) >= 256  # the first once the window holds min(window, max(2 D, 256)) samples
    for step in steps:
        expected = statistics(np.concatenate(batches[: step + 1])[-4096:])
        at = stored.filter(stored["step"] == step)
        got = dict(zip((k.split("/", 1)[1] for k in at["key"]), at["value"]))
        assert got == pytest.approx(expected, rel=1e-6)


def test_a_worker_behind_leaves_the_training_thread_alone_and_memory_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker.embedding_slot import fast_path
    from tracker.embeddings import EmbeddingMonitor

    release = threading.Event()
    process = EmbeddingMonitor._process
    monkeypatch.setattr(EmbeddingMonitor, "_process",
                        lambda self, *a: (release.wait(10), process(self, *a))[1])  # a worker stuck in a batch
    run = tracker.init("emb")
    z = np.random.default_rng(8).normal(size=(64, 8)).astype(np.float32)
    run.log_embeddings("z", z, step=0, window=512, every=64)
    slot = run._embeddings._slots["z"]
    allocated = []
    new = slot.new
    slot.new = lambda: allocated.append(1) or new()
    run._embeddings.fast["z"] = fast_path(run._embeddings, slot)  # the key's fast path, allocating through it
    import time

    t0 = time.perf_counter()
    for step in range(1, 400):
        run.log_embeddings("z", z, step=step)
        assert slot.queued() <= slot.bound + 64  # 1.5 windows queued at most, then the oldest go
    assert time.perf_counter() - t0 < 2.0  # never waited for the stuck worker
    assert slot.dropped > 0 and 0 < len(allocated) <= (slot.bound + 512) // 64 + 3  # the pool's buffers recycled
    release.set()
    run.finish()
    last = tracker.query("SELECT max(step) AS s FROM curves WHERE key = 'z/std'")["s"][0]
    assert last == 399  # the newest rows still make the last statistics


def test_an_evaluation_due_after_more_than_a_window_still_comes() -> None:
    import time

    run = tracker.init("emb")
    z = np.random.default_rng(9).normal(size=(16, 4)).astype(np.float32)
    for step in range(5):  # 80 rows: more than the window, fewer than `every` and than the queue's bound (96)
        run.log_embeddings("z", z, step=step, window=64, every=200)
    slot = run._embeddings._slots["z"]
    deadline = time.monotonic() + 5.0
    while slot.taken == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slot.taken >= 64 and slot.dropped == 0  # the worker took a window's worth without being asked
    for step in range(5, 13):
        run.log_embeddings("z", z, step=step)
    assert wait(run)
    run.finish()
    steps = tracker.query("SELECT step FROM curves WHERE key = 'z/std' ORDER BY step")["step"].to_list()
    assert steps == [12]  # 208 rows: the first evaluation once 200 came


def test_a_finish_while_the_worker_holds_batches_still_logs_the_last_statistics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """finish() begins right after the worker took the first 64 rows and before it put them in the
    window: they go back to close(), which logs the statistics at the last step (they used to be
    dropped unread, leaving close() too few rows for any statistics)."""
    import contextlib
    import time

    import tracker.embeddings as embeddings

    took, closing = threading.Event(), []

    @contextlib.contextmanager
    def held_until_finish() -> Any:
        if threading.current_thread().name.startswith("tracker-embeddings") and not took.is_set():
            took.set()  # the worker holds its batches now; let finish() begin before it goes on
            deadline = time.monotonic() + 5.0
            while not closing[0]._closed and time.monotonic() < deadline:
                time.sleep(0.005)
        yield

    monkeypatch.setattr(embeddings, "_one_blas_thread", held_until_finish)
    run = tracker.init("emb", system=False, config={"analysis": False})
    rng = np.random.default_rng(0)
    for step in range(12):  # 96 rows: the worker takes the first 64 once they are queued
        run.log_embeddings("out", rng.normal(size=(8, 3)), step=step, window=64, every=16)
        if step == 7:
            closing.append(run._embeddings)
            assert took.wait(5.0)
    run.finish()
    steps = tracker.query("SELECT step FROM curves WHERE run_id = ? AND key = 'out/rankme'", [run.run_id])["step"]
    assert steps.to_list() == [11]  # the newest 64 rows, evaluated once by close()
