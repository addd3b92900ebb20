"""Real YOLO11n trainings with Ultralytics, tracked: per-batch and per-epoch logging, loss
substitution, repeat-factor sampling, kill -9 and resume, offline and polite training.

The trainings run once per module (in child processes, the way ``make demo`` runs
them): run A with the stock loss, run B with class-weighted BCE and repeat-factor
sampling, killed with SIGKILL mid-epoch and resumed.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import tracker
from tracker.errors import ConfigError
from tracker.host import Host, make_plugin_manager, set_host
from tracker.integrations.ultralytics import FLUSH_INTERVAL_S
from tracker.integrations.ultralytics_env import apply_env, offline_config
from tracker.integrations.yolo_synthetic import SyntheticDataset, make_dataset
from tracker.losses import LossTerm, reduce_elementwise
from tracker.store import Store
from tracker.integrations.yolo_demo import NETWORK_LOG, TrainSpec, child_env, run_child

pytestmark = pytest.mark.slow
EPOCHS, BATCH, RFS = 2, 8, 0.2
WEIGHTED = {"scheme": "effective_number", "beta": 0.99}
KILL_AT = (1, 1)  # epoch index, batch index
KILLED_FLUSH_S = 1.0  # the killed run's flush interval (the plain run keeps track()'s default)


@dataclass
class Trained:
    workdir: Path
    home: Path
    user_home: Path
    data: SyntheticDataset
    plain: str
    weighted: str
    kill_status: int


def _run_id(workdir: Path, name: str) -> str:
    return json.loads((workdir / "runs" / name / "tracker.json").read_text())["run_id"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    workdir = tmp_path_factory.mktemp("yolo")
    home, user_home = workdir / "tracker-home", tmp_path_factory.mktemp("user-home")
    data = make_dataset(workdir / "data", train=32, val=8, imgsz=64)
    env = {"HOME": str(user_home), "XDG_CONFIG_HOME": "", "XDG_CACHE_HOME": ""}
    common = {"workdir": str(workdir), "data": str(data.yaml), "epochs": EPOCHS, "batch": BATCH,
              "guard_network": True, "project": "test"}
    logs = open(workdir / "children.log", "ab")
    try:
        # run A trains beside run B's kill and resume (one user's two trainings at once, one store): on two cores
        # one child's imports and start-up (single-threaded, seconds) overlap the other's training
        with ThreadPoolExecutor(1) as beside:
            plain = TrainSpec(name="plain", **common)
            plain_status = beside.submit(run_child, plain, home, log=logs, extra_env=env)
            # the killed run flushes every second, so that waiting out two flushes before the kill takes 3 s, not 11
            weighted = TrainSpec(name="weighted", loss="class_weighted_bce", loss_params=WEIGHTED,
                                 rfs_threshold=RFS, pause_at=KILL_AT, flush_interval=KILLED_FLUSH_S, **common)
            killed = run_child(weighted, home, log=logs, extra_env=env,
                               kill_after_pause_s=2 * KILLED_FLUSH_S + 1.0)  # > 2 flushes
            resumed = TrainSpec(**{**weighted.__dict__, "pause_at": None, "resume": True})
            assert run_child(resumed, home, log=logs, extra_env=env) == 0, \
                (workdir / "children.log").read_text()[-3000:]
            assert plain_status.result() == 0, (workdir / "children.log").read_text()[-3000:]
    finally:
        logs.close()
    return Trained(workdir, home, user_home, data, _run_id(workdir, "plain"), _run_id(workdir, "weighted"), killed)


def _query(t: Trained, sql: str, params: list[Any] | None = None) -> Any:
    return Store(t.home).query(sql, params or [])


def _series(t: Trained, run_id: str, key: str) -> dict[int, float]:
    df = _query(t, "SELECT step, value FROM curves WHERE run_id = ? AND key = ? ORDER BY step", [run_id, key])
    steps = df["step"].to_list()
    assert len(steps) == len(set(steps)), f"duplicate steps in {key}"
    return dict(zip(steps, df["value"].to_list()))


def _results_csv(t: Trained, name: str) -> list[dict[str, float]]:
    with open(t.workdir / "runs" / name / "results.csv") as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _config(t: Trained, run_id: str) -> dict[str, Any]:
    raw = _query(t, "SELECT config FROM runs WHERE run_id = ?", [run_id])["config"][0]
    return json.loads(raw) if isinstance(raw, str) else raw


# -- 1. per batch, per epoch, config ------------------------------------------------------
def test_per_batch_losses_and_learning_rates_at_global_steps(trained: Trained) -> None:
    batches = 4  # 32 images / batch 8
    rows = _results_csv(trained, "plain")
    for key in ("train/box_loss", "train/cls_loss", "train/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2"):
        series = _series(trained, trained.plain, key)
        assert sorted(series) == list(range(EPOCHS * batches)), key
        for epoch, row in enumerate(rows):
            values = [series[epoch * batches + i] for i in range(batches)]
            if key.startswith("train/"):  # results.csv holds the epoch mean of the per-batch items
                assert np.mean(values) == pytest.approx(row[key], abs=1e-4), (key, epoch)
            else:  # and the learning rate of the epoch's last batch
                assert values[-1] == pytest.approx(row[key], rel=1e-6), (key, epoch)


def test_per_class_cls_loss_sums_to_the_batch_cls_loss(trained: Trained) -> None:
    for run_id in (trained.plain, trained.weighted):
        total = _series(trained, run_id, "train/cls_loss")
        df = _query(trained, "SELECT step, count(*) AS n, sum(value) AS s FROM class_curves "
                             "WHERE run_id = ? AND key = 'train/cls_loss' GROUP BY step ORDER BY step", [run_id])
        assert df["step"].to_list() == sorted(total)
        assert set(df["n"].to_list()) == {80}
        for step, s in zip(df["step"].to_list(), df["s"].to_list()):
            assert s == pytest.approx(total[step], rel=1e-5), step


def test_data_time_of_every_batch_is_logged_for_the_stall_detector(trained: Trained) -> None:
    series = _series(trained, trained.plain, "sys/data_time")
    assert sorted(series) == sorted(_series(trained, trained.plain, "train/box_loss"))
    assert all(0 < v < 60 for v in series.values()), series


def test_epoch_metrics_at_the_last_batch_and_no_phantom_epoch(trained: Trained) -> None:
    batches = 4
    rows = _results_csv(trained, "plain")
    epochs = _series(trained, trained.plain, "epoch")
    assert epochs == {batches - 1: 1.0, 2 * batches - 1: 2.0}
    for key in ("metrics/mAP50(B)", "metrics/mAP50-95(B)", "metrics/precision(B)", "metrics/recall(B)",
                "val/box_loss", "val/cls_loss", "val/dfl_loss"):
        series = _series(trained, trained.plain, key)
        assert sorted(series) == sorted(epochs), key
        for step, row in zip(sorted(series), rows):
            assert series[step] == pytest.approx(row[key], abs=1e-5), key
    last = _query(trained, "SELECT max(step) AS m FROM curves WHERE run_id = ?", [trained.plain])["m"][0]
    assert last == EPOCHS * batches - 1  # the final evaluation of best.pt adds no step
    best = _series(trained, trained.plain, "best/metrics/mAP50(B)")
    assert list(best) == [last]


def test_config_holds_trainer_args_class_names_and_label_counts(trained: Trained) -> None:
    config = _config(trained, trained.plain)
    assert config["epochs"] == EPOCHS and config["imgsz"] == 64 and config["batch"] == BATCH
    assert config["data"] == str(trained.data.yaml) and config["batches_per_epoch"] == 4
    assert config["tracker_flush_interval"] == FLUSH_INTERVAL_S  # the run's flusher works in larger chunks
    counts = np.zeros(80, np.int64)
    for file in (trained.data.root / "labels" / "train").glob("*.txt"):
        for line in file.read_text().split("\n"):
            if line.strip():
                counts[int(line.split()[0])] += 1
    assert list(config["class_counts"].values()) == counts.tolist()
    assert list(config["class_counts"]) == trained.data.names
    names = _query(trained, "SELECT name FROM classes WHERE run_id = ? ORDER BY class_index", [trained.plain])
    assert names["name"].to_list() == trained.data.names
    assert _query(trained, "SELECT status FROM runs WHERE run_id = ?", [trained.plain])["status"][0] == "finished"


def test_log_every_thins_the_per_batch_values(ultralytics_here: Any, trained: Trained, tmp_path: Path) -> None:
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    track(model, project="every", log_every=3)
    model.train(data=str(trained.data.yaml), epochs=1, imgsz=64, batch=BATCH, nbs=BATCH, device="cpu", workers=0,
                plots=False, project=str(tmp_path / "runs"), name="every", verbose=False, amp=False)
    steps = tracker.query("SELECT key, list(step ORDER BY step) AS steps FROM curves GROUP BY key")
    by_key = dict(zip(steps["key"].to_list(), steps["steps"].to_list()))
    assert by_key["train/cls_loss"] == [0, 3] and by_key["lr/pg0"] == [0, 3]
    assert by_key["epoch"] == [3] and by_key["metrics/mAP50(B)"] == [3]  # the epoch's values are always logged
    per_class = tracker.query("SELECT DISTINCT step FROM class_curves ORDER BY step")["step"].to_list()
    assert per_class == [0, 3]


def test_loss_items_in_the_older_tensor_form() -> None:
    import torch

    from tracker.integrations.ultralytics import loss_items

    class Old:
        loss_items = torch.tensor([1.5, 0.25, 0.75])
        loss_names = ("box_loss", "cls_loss", "dfl_loss")

    assert loss_items(Old()) == {"box_loss": 1.5, "cls_loss": 0.25, "dfl_loss": 0.75}


# -- 2. loss substitution ------------------------------------------------------------------
def test_weighted_run_uses_the_term_with_the_label_counts(trained: Trained) -> None:
    from tracker.weights import class_weights

    config = _config(trained, trained.weighted)
    assert config["loss"] == {"term": "class_weighted_bce", **WEIGHTED}
    counts = np.array(list(config["class_counts"].values()), dtype=np.float64)
    expected = class_weights(counts, "effective_number", beta=0.99)
    np.testing.assert_allclose(config["class_weights"], expected, rtol=1e-6)
    assert max(config["class_weights"]) > 2 * min(config["class_weights"])  # rare classes weigh more


@pytest.fixture(scope="module")
def ultralytics_here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Ultralytics imported in this process with a private offline configuration."""
    with pytest.MonkeyPatch.context() as mp:
        env = offline_config(tmp_path_factory.mktemp("ultralytics-config"))
        for key, value in env.items():
            mp.setenv(key, value)
        if "ultralytics" not in sys.modules:
            apply_env(env)
        import ultralytics

        yield ultralytics


def _model_and_batch(seed: int = 0) -> tuple[Any, dict[str, Any]]:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(seed)
    model = DetectionModel("yolo11n.yaml", nc=80, verbose=False)
    model.args = get_cfg()
    batch = {
        "img": torch.rand(2, 3, 64, 64),
        "batch_idx": torch.tensor([0.0, 0.0, 1.0]),
        "cls": torch.tensor([[0.0], [17.0], [56.0]]),
        "bboxes": torch.tensor([[0.5, 0.5, 0.4, 0.4], [0.25, 0.3, 0.3, 0.2], [0.6, 0.6, 0.5, 0.5]]),
    }
    return model, batch


def _loss_and_grads(model: Any, batch: dict[str, Any]) -> tuple[dict[str, float], list[Any]]:
    model.zero_grad()
    total, items = model.loss(batch)
    total.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return {k: float(v) for k, v in items.items()}, grads


class UserBCE:
    """A user's plugin: plain BCE with only a numpy reference (no torch kernel)."""

    @tracker.hookimpl
    def tracker_register_losses(self, register: Any) -> None:
        def reference(logits: np.ndarray, targets: np.ndarray, grad: Any, *, reduction: str) -> Any:
            x, y = logits.astype(np.float64), targets.astype(np.float64)
            loss = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
            return reduce_elementwise(loss, None if grad is None else 1 / (1 + np.exp(-x)) - y, y, grad, reduction)

        register(LossTerm(name="user_bce", reference=reference, description="a user's numpy-only BCE"))


@pytest.mark.parametrize("term", ["class_weighted_bce", "user_bce"])
def test_substituted_term_with_no_weights_equals_the_stock_loss(ultralytics_here: Any, term: str) -> None:
    from tracker.integrations.ultralytics_loss import install, term_module

    pm = make_plugin_manager(default_plugins=("plugins.losses",), entry_points=False)
    pm.register(UserBCE(), name="user")
    set_host(Host(pm))
    stock, batch = _model_and_batch()
    ours = copy.deepcopy(stock)
    stock_items, stock_grads = _loss_and_grads(stock, batch)
    params = {"scheme": "none"} if term == "class_weighted_bce" else {}
    per_class = install(ours, lambda: term_module(term, params, np.ones(80), 80)[0])
    items, grads = _loss_and_grads(ours, batch)
    for key in ("box_loss", "cls_loss", "dfl_loss"):
        assert items[key] == pytest.approx(stock_items[key], rel=1e-4), key  # float32 rounding
    assert len(grads) == len(stock_grads)
    for a, b in zip(grads, stock_grads):  # equal up to float32 rounding, relative to each tensor's scale
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max()) + 1e-8
    vector = per_class()
    assert vector is not None and vector.shape == (80,)
    assert float(vector.sum()) == pytest.approx(items["cls_loss"], rel=1e-5)


def test_weighted_term_changes_the_loss_and_its_gradient(ultralytics_here: Any) -> None:
    from tracker.integrations.ultralytics_loss import install, term_module

    stock, batch = _model_and_batch()
    ours = copy.deepcopy(stock)
    stock_items, _ = _loss_and_grads(stock, batch)
    counts = np.array([1000.0] * 40 + [2.0] * 40)
    install(ours, lambda: term_module("sigmoid_focal", {"scheme": "inverse", "gamma": 2.0}, counts, 80)[0])
    items, grads = _loss_and_grads(ours, batch)
    assert items["box_loss"] == pytest.approx(stock_items["box_loss"], rel=1e-5)
    assert not math.isclose(items["cls_loss"], stock_items["cls_loss"], rel_tol=1e-3)
    assert all(bool(np.isfinite(g.numpy()).all()) for g in grads)


def test_without_a_term_ultralytics_class_weights_apply_once_and_show_per_class(ultralytics_here: Any) -> None:
    import torch

    from tracker.integrations.ultralytics_loss import install

    stock, batch = _model_and_batch()
    unweighted = copy.deepcopy(stock)
    weights = torch.linspace(0.2, 3.0, 80)
    stock.class_weights = weights  # what Ultralytics sets for cls_pw > 0
    ours = copy.deepcopy(stock)
    stock_items, _ = _loss_and_grads(stock, batch)
    per_class = install(ours, None)
    items, _ = _loss_and_grads(ours, batch)
    assert items["cls_loss"] == pytest.approx(stock_items["cls_loss"], rel=1e-6)
    vector = per_class()
    assert float(vector.sum()) == pytest.approx(items["cls_loss"], rel=1e-5)
    plain = install(unweighted, None)
    _loss_and_grads(unweighted, batch)
    np.testing.assert_allclose(vector.numpy(), (plain() * weights.double()).numpy(), rtol=1e-5)


def test_cls_pw_with_a_loss_term_is_refused(ultralytics_here: Any, tmp_path: Path) -> None:
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    track(model, loss="class_weighted_bce", scheme="effective_number")
    with pytest.raises(ConfigError, match=r"cls_pw=0.5 would weight the classes twice.*power=0.5"):
        model.train(data=str(tmp_path / "absent.yaml"), cls_pw=0.5, epochs=1, imgsz=64, device="cpu",
                    project=str(tmp_path / "runs"), name="refused", plots=False)


def test_bad_loss_arguments_fail_before_training(ultralytics_here: Any) -> None:
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    with pytest.raises(ConfigError, match="Unknown loss 'bce2'"):
        track(model, loss="bce2")
    with pytest.raises(ConfigError, match="Unknown parameter 'gama'"):
        track(model, loss="sigmoid_focal", gama=2.0)
    with pytest.raises(ConfigError, match="without loss="):
        track(model, scheme="inverse")
    for bad in (0, -1.0, float("nan"), True, "5", 61.0):
        with pytest.raises(ConfigError, match=r"flush_interval is .*expected seconds in \(0, 60"):
            track(model, flush_interval=bad)


# -- 3. resume after kill -9 ---------------------------------------------------------------
def test_kill_mid_epoch_and_resume_continue_the_same_run(trained: Trained) -> None:
    assert trained.kill_status == -9
    config = _config(trained, trained.weighted)
    batches = config["batches_per_epoch"]
    segments = _query(trained, "SELECT segment, start_step, reason FROM segments WHERE run_id = ? ORDER BY segment",
                      [trained.weighted])
    assert segments.rows() == [(0, 0, "start"), (1, batches, "resume")]  # exactly one boundary: epoch 2's start
    for key in ("train/box_loss", "train/cls_loss", "lr/pg0"):
        assert sorted(_series(trained, trained.weighted, key)) == list(range(EPOCHS * batches)), key
    hidden = _query(trained, "SELECT DISTINCT step FROM hidden_metrics WHERE run_id = ? AND key = 'train/cls_loss' "
                             "ORDER BY step", [trained.weighted])
    assert hidden["step"].to_list() == list(range(batches, batches + KILL_AT[1] + 1))  # replayed, superseded
    assert _series(trained, trained.weighted, "epoch") == {batches - 1: 1.0, 2 * batches - 1: 2.0}
    status = _query(trained, "SELECT status FROM runs WHERE run_id = ?", [trained.weighted])["status"][0]
    assert status == "finished"
    assert _query(trained, "SELECT count(*) AS n FROM runs")["n"][0] == 2  # the resume made no new run


# -- 4. repeat-factor sampling and COCO subsets ----------------------------------------------
def test_repeat_factor_sampling_sets_the_epoch_length(trained: Trained) -> None:
    from tracker.sampling import repeat_factors, as_csr

    labels = []
    for file in sorted((trained.data.root / "labels" / "train").glob("*.txt")):
        labels.append([int(line.split()[0]) for line in file.read_text().split("\n") if line.strip()])
    indptr, classes, n = as_csr(labels)
    draws = math.ceil(repeat_factors(indptr, classes, n, RFS).sum())
    assert draws > 32
    assert _config(trained, trained.weighted)["batches_per_epoch"] == math.ceil(draws / BATCH)


def test_coco_balance_output_becomes_a_yolo_dataset(ultralytics_here: Any, coco_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tracker.cli import build_cli
    from tracker.integrations.ultralytics_data import coco_to_yolo

    balanced = tmp_path / "balanced.json"
    res = CliRunner().invoke(build_cli(), ["coco", "balance", str(coco_dir / "instances_val2014_100.json"),
                                           "--out", str(balanced), "--max-images", "40"])
    assert res.exit_code == 0, res.output
    yaml = coco_to_yolo(balanced, tmp_path / "yolo")
    data = json.loads(balanced.read_text())
    files = sorted((tmp_path / "yolo" / "labels" / "train").glob("*.txt"))
    with_boxes = {a["image_id"] for a in data["annotations"] if not a.get("iscrowd")}
    assert len(files) == len(with_boxes)
    classes = {int(line.split()[0]) for f in files for line in f.read_text().split("\n") if line.strip()}
    assert classes and max(classes) < 80
    text = yaml.read_text()
    assert "nc: 80" in text and "  0: person" in text
    with pytest.raises(ConfigError, match="exists"):
        coco_to_yolo(balanced, tmp_path / "yolo")


# -- 5. checkpoints, offline, polite -----------------------------------------------------------
def test_checkpoints_load_with_plain_yolo_in_a_process_without_tracker(trained: Trained) -> None:
    code = (
        "import sys\n"
        "sys.modules['tracker'] = None  # unpickling anything of tracker would fail\n"
        "from ultralytics import YOLO\n"
        "for path in sys.argv[1:]:\n"
        "    model = YOLO(path)\n"
        "    assert type(model.model).__name__ == 'DetectionModel', type(model.model)\n"
        "    assert getattr(model.model, 'criterion', None) is None\n"
        "    assert len(model.names) == 80\n"
        "print('loaded', len(sys.argv) - 1)\n"
    )
    paths = [str(trained.workdir / "runs" / n / "weights" / w) for n in ("plain", "weighted")
             for w in ("last.pt", "best.pt")]
    env = child_env(trained.workdir, trained.home)
    env.pop("PYTHONPATH")
    out = subprocess.run([sys.executable, "-c", code, *paths], env=env, cwd=trained.workdir,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loaded 4" in out.stdout


def test_training_made_no_network_call_and_wrote_only_its_folders(trained: Trained) -> None:
    assert not (trained.workdir / NETWORK_LOG).exists(), (trained.workdir / NETWORK_LOG).read_text()
    assert list(trained.user_home.iterdir()) == []
    expected = {"data", "runs", "ultralytics-config", "tracker-home", "children.log"}
    assert {p.name for p in trained.workdir.iterdir()} <= expected


def test_the_network_guard_sees_ultralytics_probes(tmp_path: Path) -> None:
    code = ("import sys; from tracker.integrations.yolo_demo import _guard_network; _guard_network(sys.argv[1]); "
            "import ultralytics.utils as u; print(u.ONLINE)")
    env = child_env(tmp_path, tmp_path / "home")
    env.pop("YOLO_OFFLINE")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("False")
    assert "one.one.one.one" in (tmp_path / NETWORK_LOG).read_text()  # without YOLO_OFFLINE it probes DNS
