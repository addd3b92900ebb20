"""Samplers: repeat factors, class-aware draws, shards across ranks, fingerprints, DataLoader."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tracker
from tracker import coco
from tracker.errors import ConfigError, PluginError
from tracker.host import Host, make_plugin_manager, set_host
from tracker.sampling import ClassAwareSampler, RepeatFactorSampler, SamplerFactory, repeat_factors

VAL100 = Path(__file__).resolve().parents[1] / "data" / "coco" / "instances_val2014_100.json"


def labels(n: int = 200, seed: int = 0) -> list[list[int]]:
    """Per-image classes: class 0 in most images, class 1..9 rarer and rarer; some empty."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row = [c for c in range(10) if rng.random() < 0.8 / (1 + 3 * c)]
        rows.append(row)
    return rows


@pytest.fixture()
def host() -> Iterator[Host]:
    fresh = Host(make_plugin_manager(default_plugins=("plugins.coco",), entry_points=False))
    old = set_host(fresh)
    yield fresh
    set_host(old)


def test_repeat_factors_follow_the_lvis_formula() -> None:
    rows = labels()
    sampler = RepeatFactorSampler(rows, threshold=0.3, rank=0, world_size=1)
    n = len(rows)
    freq = {c: sum(c in r for r in rows) / n for c in range(10)}
    for i, row in enumerate(rows):
        expected = max([max(1.0, math.sqrt(0.3 / freq[c])) for c in row], default=1.0)
        assert sampler.repeat_factors[i] == pytest.approx(expected)


def test_repeat_factor_rounding_is_stochastic_and_unbiased() -> None:
    rows = labels()
    sampler = RepeatFactorSampler(rows, threshold=0.3, seed=4, rank=0, world_size=1)
    totals = np.zeros(len(rows))
    epochs = 400
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = sampler.global_order()
        counts = np.bincount(order, minlength=len(rows))
        floor = np.floor(sampler.repeat_factors)
        assert ((counts == floor) | (counts == floor + 1)).all()
        totals += counts
    assert np.abs(totals / epochs - sampler.repeat_factors).max() < 0.12


def test_repeat_factor_on_a_coco_index_matches_a_plain_computation() -> None:
    index = coco.load(VAL100)
    sampler = RepeatFactorSampler(index, threshold=0.1, rank=0, world_size=1)
    per_image = [set(index.ann_category[index.ann_image == i].tolist()) for i in range(index.num_images)]
    freq = Counter(c for cats in per_image for c in cats)
    for i, cats in enumerate(per_image):
        expected = max([max(1.0, math.sqrt(0.1 / (freq[c] / 100))) for c in cats], default=1.0)
        assert sampler.repeat_factors[i] == pytest.approx(expected)
    assert sampler.repeat_factors.max() == pytest.approx(math.sqrt(0.1 / 0.01))


@pytest.mark.parametrize("threshold", [0.0, -1.0])
def test_bad_threshold(threshold: float) -> None:
    with pytest.raises(ConfigError, match=r"threshold .* must be > 0"):
        repeat_factors(np.array([0, 1]), np.array([0]), 1, threshold)


def test_class_aware_draws_classes_uniformly() -> None:
    rows = labels(400)
    sampler = ClassAwareSampler(rows, num_samples=40000, seed=1, rank=0, world_size=1)
    order = sampler.global_order()
    assert len(order) == 40000
    present = sorted({c for r in rows for c in r})
    holds = {c: [i for i, r in enumerate(rows) if c in r] for c in present}
    expected = np.zeros(len(rows))
    for c in present:
        expected[holds[c]] += 1 / len(present) / len(holds[c])
    drawn = np.bincount(order, minlength=len(rows)) / len(order)
    for c in present:
        assert drawn[holds[c]].sum() == pytest.approx(expected[holds[c]].sum(), abs=0.01)
    assert expected[holds[9 if 9 in holds else present[-1]]].sum() > 1 / len(present) - 1e-9
    assert set(order.tolist()) <= {i for i, r in enumerate(rows) if r}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 60), st.integers(1, 7), st.booleans(), st.integers(0, 3))
def test_shards_are_disjoint_equal_and_cover(n: int, world: int, drop_last: bool, epoch: int) -> None:
    rows = labels(n, seed=n)
    ref = RepeatFactorSampler(rows, threshold=0.2, seed=9, rank=0, world_size=1)
    ref.set_epoch(epoch)
    order = ref.global_order().tolist()
    size = len(order) // world if drop_last else -(-len(order) // world)
    padded = [order[i % len(order)] for i in range(size * world)] if order else []
    shards = []
    for rank in range(world):
        s = RepeatFactorSampler(rows, threshold=0.2, seed=9, rank=rank, world_size=world,
                                drop_last=drop_last)
        s.set_epoch(epoch)
        shard = list(s)
        assert len(s) == len(shard) == size
        assert shard == padded[rank::world]
        shards.append(shard)
    assert Counter(i for shard in shards for i in shard) == Counter(padded)
    if not drop_last:
        assert {i for shard in shards for i in shard} == set(order)


def test_epochs_change_the_order_and_seeds_repeat_it() -> None:
    rows = labels()
    a = ClassAwareSampler(rows, seed=3, rank=0, world_size=1)
    b = ClassAwareSampler(rows, seed=3, rank=0, world_size=1)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(a) == list(b) and a.fingerprint() == b.fingerprint()
    c = ClassAwareSampler(rows, seed=4, rank=0, world_size=1)
    c.set_epoch(1)
    assert c.fingerprint() != a.fingerprint()


def test_fingerprint_range_and_logging() -> None:
    sampler = RepeatFactorSampler(labels(), threshold=0.3, seed=1, rank=0, world_size=1)
    logged: list[tuple[dict[str, float], int | None]] = []

    class FakeRun:
        def log(self, values: dict[str, float], step: int | None = None) -> None:
            logged.append((values, step))

    fps = []
    for epoch in range(20):
        sampler.set_epoch(epoch)
        fp = sampler.fingerprint()
        assert 0 <= fp < 2**53 and float(fp) == fp
        fps.append(fp)
        sampler.log_fingerprint(FakeRun(), step=epoch * 10)
    assert len(set(fps)) == 20
    assert logged == [({"rng/fingerprint": float(fp), "rng/epoch": float(e)}, e * 10)
                      for e, fp in enumerate(fps)]


def test_rank_and_world_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    sampler = ClassAwareSampler(labels(), seed=0)
    assert (sampler.rank, sampler.world_size) == (2, 3)
    with pytest.raises(ConfigError, match=r"rank 3 / world_size 3 is not a valid placement"):
        ClassAwareSampler(labels(), rank=3)


def test_dataloader_takes_the_sampler() -> None:
    rows = labels(64)
    data = torch.arange(64)
    sampler = RepeatFactorSampler(rows, threshold=0.3, seed=2, rank=1, world_size=2)
    sampler.set_epoch(5)
    loader = torch.utils.data.DataLoader(data, sampler=sampler, batch_size=8)
    got = torch.cat(list(loader)).tolist()
    assert got == sampler.shard().tolist()
    assert len(loader) == math.ceil(len(sampler) / 8)


def test_registry_lists_and_builds_samplers(host: Host) -> None:
    found = tracker.samplers()
    assert set(found) == {"repeat_factor", "class_aware"}
    assert host.registry("samplers").owners["class_aware"] == "coco"
    sampler = tracker.sampler("repeat_factor", labels=labels(), threshold=0.2, rank=0, world_size=1)
    assert isinstance(sampler, RepeatFactorSampler) and sampler.threshold == 0.2
    with pytest.raises(ConfigError, match=r"sampler 'class_aware': .*unexpected keyword.*it takes labels"):
        tracker.sampler("class_aware", labels=[], thresh=1)
    with pytest.raises(PluginError, match=r"Unknown sampler 'nope'; available: class_aware, repeat_factor"):
        tracker.sampler("nope")


def test_factory_validation() -> None:
    with pytest.raises(PluginError, match="is not callable"):
        SamplerFactory("bad", 42).validate()  # type: ignore[arg-type]


_RANK_SCRIPT = """
import json, sys
import numpy as np
from tracker.sampling import ClassAwareSampler, RepeatFactorSampler
rng = np.random.default_rng(0)
rows = [[c for c in range(8) if rng.random() < 0.7 / (1 + 2 * c)] for _ in range(101)]
out = {}
for name, cls, kw in (("rf", RepeatFactorSampler, {"threshold": 0.3}), ("ca", ClassAwareSampler, {})):
    s = cls(rows, seed=11, **kw)
    s.set_epoch(int(sys.argv[1]))
    out[name] = {"shard": list(s), "len": len(s), "fp": s.fingerprint(), "rank": s.rank,
                 "order": s.global_order().tolist()}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_four_ranks_in_separate_processes_agree() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [
        subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, "7"], stdout=subprocess.PIPE,
                         env={**env, "RANK": str(r), "WORLD_SIZE": "4"}, text=True)
        for r in range(4)
    ]
    results: list[dict[str, Any]] = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        results.append(json.loads(out))
    for name in ("rf", "ca"):
        parts = [r[name] for r in results]
        assert [p["rank"] for p in parts] == [0, 1, 2, 3]
        assert len({p["fp"] for p in parts}) == 1
        order = parts[0]["order"]
        assert all(p["order"] == order for p in parts)
        lengths = {p["len"] for p in parts} | {len(p["shard"]) for p in parts}
        assert lengths == {math.ceil(len(order) / 4)}
        padded = (order * 2)[: 4 * lengths.pop()]
        for rank, p in enumerate(parts):
            assert p["shard"] == padded[rank::4]
        counted = Counter(i for p in parts for i in p["shard"])
        assert counted == Counter(padded)
        assert set(order) == set(counted)
