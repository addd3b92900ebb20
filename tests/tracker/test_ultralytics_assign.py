"""Assignment statistics, gradient balance and AP per class from one real YOLO11n training.

One in-process training (2 epochs of 2 batches at imgsz 64) with ``track()`` attached. The
test's own callback wraps, outside the tracker's probes, the criterion's loss call (the batch's
labels), its assigner (the assignment) and its classification loss (logits and targets), so
each logged value is checked against what the test recomputes itself: the label counts per
class, and the gradient of the positives by ``torch.autograd``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import tracker
from tracker.errors import ConfigError
from tracker.integrations.ultralytics_env import apply_env, offline_config
from tracker.integrations.yolo_synthetic import make_dataset
from tracker.store import Store

pytestmark = pytest.mark.slow
BATCH, TRAIN, EPOCHS = 8, 16, 2


@dataclass
class Captured:
    """What the test saw of each training batch, by global step."""

    home: Path
    run_id: str
    names: list[str]
    batches: dict[int, dict[str, Any]] = field(default_factory=dict)
    gain: float = 0.0


def _capture(cap: Captured, state: dict[str, Any]) -> Any:
    """An ``on_pretrain_routine_end`` callback wrapping the criterion's parts after the tracker's."""
    from ultralytics.utils.torch_utils import unwrap_model

    def setup(trainer: Any) -> None:
        crit = unwrap_model(trainer.model).criterion
        cap.gain = float(crit.hyp.cls)
        loss, assign, bce = crit.loss, crit.assigner.forward, crit.bce.forward
        batches = len(trainer.train_loader)

        def step() -> int:
            return int(trainer.epoch) * batches + state["batch"]

        def on_loss(preds: Any, batch: Any) -> Any:
            cap.batches[step()] = {"cls": batch["cls"].reshape(-1).long().clone(),
                                   "nimg": int(batch["img"].shape[0])}
            return loss(preds, batch)

        def on_assign(*args: Any, **kw: Any) -> Any:
            out = assign(*args, **kw)
            cap.batches[step()].update(labels=out[0].clone(), fg=out[3].clone(), gt_idx=out[4].clone(),
                                       gt_labels=args[3].squeeze(-1).clone(), mask_gt=args[5].squeeze(-1).clone())
            return out

        def on_bce(logits: Any, targets: Any) -> Any:
            cap.batches[step()].update(logits=logits.detach().clone(), targets=targets.detach().clone())
            return bce(logits, targets)

        crit.loss, crit.assigner.forward, crit.bce.forward = on_loss, on_assign, on_bce

    return setup


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    root = tmp_path_factory.mktemp("assign")
    home = root / "tracker-home"
    with pytest.MonkeyPatch.context() as mp:
        env = offline_config(root / "ultralytics-config")
        for key, value in {**env, "TRACKER_HOME": str(home), "TRACKER_LOGGERS": "store",
                           "TRACKER_SYSTEM": "0"}.items():
            mp.setenv(key, value)
        if "ultralytics" not in sys.modules:
            apply_env(env)
        from ultralytics import YOLO

        from tracker.integrations.ultralytics import track

        data = make_dataset(root / "data", train=TRAIN, val=8, imgsz=64, max_objects=4)
        model = YOLO("yolo11n.yaml")
        track(model, project="assign", name="assign")
        cap = Captured(home, "", list(data.names))
        state = {"batch": 0}
        model.add_callback("on_pretrain_routine_end", _capture(cap, state))
        model.add_callback("on_train_epoch_start", lambda t: state.update(batch=0))
        model.add_callback("on_train_batch_end", lambda t: state.update(batch=state["batch"] + 1))
        model.train(data=str(data.yaml), epochs=EPOCHS, imgsz=64, batch=BATCH, nbs=BATCH, device="cpu", workers=0,
                    plots=False, project=str(root / "runs"), name="assign", verbose=False, amp=False, seed=0)
        import json

        cap.run_id = json.loads((root / "runs" / "assign" / "tracker.json").read_text())["run_id"]
        yield cap


def _classes(cap: Captured, key: str) -> dict[int, np.ndarray]:
    df = Store(cap.home).query(
        "SELECT step, class_index, value FROM class_curves WHERE run_id = ? AND key = ? ORDER BY step, class_index",
        [cap.run_id, key])
    out: dict[int, np.ndarray] = {}
    for step, idx, value in zip(df["step"].to_list(), df["class_index"].to_list(), df["value"].to_list()):
        out.setdefault(int(step), np.full(len(cap.names), np.nan))[int(idx)] = value
    return out


def _scalars(cap: Captured, prefix: str) -> dict[tuple[int, str], float]:
    df = Store(cap.home).query("SELECT step, key, value FROM curves WHERE run_id = ? AND starts_with(key, ?)",
                               [cap.run_id, prefix])
    return {(int(s), k): v for s, k, v in zip(df["step"].to_list(), df["key"].to_list(), df["value"].to_list())}


def test_assign_gt_equals_the_batch_label_count_per_class(trained: Captured) -> None:
    gt = _classes(trained, "assign/gt")
    assert sorted(gt) == sorted(trained.batches) == list(range(EPOCHS * TRAIN // BATCH))
    for step, seen in trained.batches.items():
        labels = np.bincount(seen["cls"].numpy(), minlength=len(trained.names))
        np.testing.assert_array_equal(gt[step], labels)
        assert gt[step].sum() > 0


def test_positives_and_boxes_without_one_agree_with_the_assignment(trained: Captured) -> None:
    import torch

    pos, no_pos = _classes(trained, "assign/pos"), _classes(trained, "assign/gt_no_pos")
    levels = _scalars(trained, "assign/")
    for step, seen in trained.batches.items():
        fg, labels = seen["fg"], seen["labels"]
        expected = np.bincount(labels[fg].long().numpy(), minlength=len(trained.names))
        np.testing.assert_array_equal(pos[step], expected)
        # a GT box has a positive when some foreground anchor points at its slot
        served = torch.zeros_like(seen["mask_gt"], dtype=torch.long)
        for b, a in fg.nonzero().tolist():
            served[b, int(seen["gt_idx"][b, a])] += 1
        lonely = seen["gt_labels"][seen["mask_gt"].bool() & (served == 0)].long().numpy()
        np.testing.assert_array_equal(no_pos[step], np.bincount(lonely, minlength=len(trained.names)))
        assert no_pos[step].sum() <= np.nansum(_classes(trained, "assign/gt")[step])
        per_level = [levels[(step, f"assign/pos/P{p}")] for p in (3, 4, 5)]
        assert sum(per_level) == pytest.approx(float(fg.sum()))  # 64x64: 64 + 16 + 4 anchors per image
        for p in (3, 4, 5):
            assert levels[(step, f"assign/gt/P{p}")] <= float(seen["mask_gt"].sum())


def test_grad_pos_and_neg_equal_autograd_of_the_classification_loss(trained: Captured) -> None:
    import torch

    gpos, gneg = _classes(trained, "grad/pos"), _classes(trained, "grad/neg")
    for step, seen in trained.batches.items():
        x = seen["logits"].float().requires_grad_(True)
        y = seen["targets"].float()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x, y, reduction="sum")
        (grad,) = torch.autograd.grad(loss / y.sum().clamp(min=1) * trained.gain, x)
        c = len(trained.names)
        mask = torch.zeros_like(grad, dtype=torch.bool)
        for b, a in seen["fg"].nonzero().tolist():
            mask[b, a, int(seen["labels"][b, a])] = True
        g = grad.abs().double()
        np.testing.assert_allclose(gpos[step], (g * mask).reshape(-1, c).sum(0).numpy(), rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(gneg[step], (g * ~mask).reshape(-1, c).sum(0).numpy(), rtol=1e-5, atol=1e-9)
        present = np.bincount(seen["cls"].numpy(), minlength=c) > 0
        assert (gpos[step][~present] == 0).all() and (gpos[step][present] >= 0).all()


def test_ap_per_class_after_each_validation(trained: Captured) -> None:
    ap50, ap = _classes(trained, "val/AP50"), _classes(trained, "val/AP50-95")
    steps = [(e + 1) * TRAIN // BATCH - 1 for e in range(EPOCHS)]
    assert sorted(ap50) == sorted(ap) == steps
    for step in steps:
        finite = np.isfinite(ap50[step])
        assert finite.any() and not finite.all()  # 8 val images hold a few of the 80 classes
        assert ((ap50[step][finite] >= 0) & (ap50[step][finite] <= 1)).all()
        assert (ap[step][finite] <= ap50[step][finite] + 1e-9).all()
    assert sorted(_classes(trained, "best/AP50")) == [steps[-1]]


def test_log_assignments_for_plain_pytorch(tmp_path: Path) -> None:
    import torch

    run = tracker.init("plain", name="detector")
    run.set_classes(["cat", "dog", "drier"])
    gt_labels = torch.tensor([[0, 2, 0], [1, 0, 0]])
    gt_mask = torch.tensor([[True, True, False], [True, False, False]])
    fg = torch.tensor([[True, True, False, False], [False, True, False, False]])
    matched = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0]])
    logits = torch.zeros(2, 4, 3)
    targets = torch.zeros(2, 4, 3)
    targets[0, 0, 0] = targets[0, 1, 0] = targets[1, 1, 1] = 1.0
    got = run.log_assignments(gt_labels=gt_labels, gt_mask=gt_mask, fg_mask=fg, matched_gt=matched, step=0,
                              anchor_strides=torch.tensor([8.0, 8.0, 16.0, 32.0]), logits=logits, targets=targets)
    np.testing.assert_array_equal(got["assign/gt"], [1, 1, 1])
    np.testing.assert_array_equal(got["assign/pos"], [2, 1, 0])
    np.testing.assert_array_equal(got["assign/gt_no_pos"], [0, 0, 1])  # the drier got no anchor
    np.testing.assert_allclose(got["grad/pos"], [1.0, 0.5, 0.0])  # |sigmoid(0) - 1| per positive
    np.testing.assert_allclose(got["grad/neg"], [3.0, 3.5, 4.0])  # 0.5 per negative sample
    assert got["assign/pos/P3"] == 3 and got["assign/pos/P4"] == 0 and got["assign/gt/P3"] == 2
    with pytest.raises(ConfigError, match="logits given without targets"):
        run.log_assignments(gt_labels=gt_labels, gt_mask=gt_mask, fg_mask=fg, matched_gt=matched, step=1,
                            logits=logits)
    run.finish()
    df = Store(run.home).query("SELECT key, count(*) AS n FROM class_curves WHERE run_id = ? GROUP BY key",
                               [run.run_id])
    assert dict(zip(df["key"].to_list(), df["n"].to_list())) == {k: 3 for k in
                                                                ("assign/gt", "assign/pos", "assign/gt_no_pos",
                                                                 "grad/pos", "grad/neg")}


def test_grad_of_a_substituted_term_and_log_every(trained: Captured) -> None:
    """A substituted term's gradient comes from autograd of the term; only every log_every-th batch is probed."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    from tracker.integrations.ultralytics_assign import attach, log_batch
    from tracker.integrations.ultralytics_loss import install, term_module
    from tracker.weights import class_weights

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=4, verbose=False)
    model.args = get_cfg()
    counts = np.array([500.0, 50.0, 5.0, 1.0])
    install(model, lambda: term_module("class_weighted_bce", {"scheme": "inverse"}, counts, 4)[0])
    probe = attach(model)
    seen: dict[str, Any] = {}
    leaf = model.criterion
    bce, assign = leaf.bce.forward, leaf.assigner.forward

    def on_bce(logits: Any, targets: Any) -> Any:
        seen.update(logits=logits.detach().clone(), targets=targets.detach().clone())
        return bce(logits, targets)

    def on_assign(*args: Any) -> Any:
        out = assign(*args)
        seen.update(fg=out[3].clone(), labels=out[0].clone())
        return out

    leaf.bce.forward, leaf.assigner.forward = on_bce, on_assign
    batch = {"img": torch.rand(2, 3, 64, 64), "batch_idx": torch.tensor([0.0, 0.0, 1.0]),
             "cls": torch.tensor([[0.0], [2.0], [3.0]]),
             "bboxes": torch.tensor([[0.5, 0.5, 0.4, 0.4], [0.25, 0.3, 0.3, 0.2], [0.6, 0.6, 0.5, 0.5]])}
    model.loss(batch)
    stats = probe.take()
    assert stats is not None
    x = seen["logits"].float().requires_grad_(True)
    y = seen["targets"].float()
    w = torch.tensor(class_weights(counts, "inverse"), dtype=torch.float32)
    loss = (torch.nn.functional.binary_cross_entropy_with_logits(x, y, reduction="none") * w).sum()
    (grad,) = torch.autograd.grad(loss / y.sum().clamp(min=1) * float(leaf.hyp.cls), x)
    mask = torch.nn.functional.one_hot(seen["labels"].long(), 4).bool() & seen["fg"].unsqueeze(-1)
    np.testing.assert_allclose(stats["grad/pos"].numpy(), (grad.abs() * mask).double().sum((0, 1)).numpy(), rtol=1e-4)
    np.testing.assert_allclose(stats["grad/neg"].numpy(), (grad.abs() * ~mask).double().sum((0, 1)).numpy(),
                               rtol=1e-4)
    np.testing.assert_array_equal(stats["assign/gt"].numpy(), [1, 0, 1, 1])

    class Run:
        logged: list[int] = []
        classes = ["a", "b", "c", "d"]

        def log_classes(self, key: str, values: Any, step: int) -> None:
            self.logged.append(step)

        def log(self, values: Any, step: int) -> None:
            pass

    run, probed = Run(), []
    for step in range(6):  # log_every=3: batches 0 and 3 are probed and logged
        model.loss(batch)
        probed.append(probe.stats is not None)
        log_batch(probe, run, step, 3)
    assert probed == [True, False, False, True, False, False]
    assert sorted(set(run.logged)) == [0, 3]


def test_a_failing_probe_turns_itself_off_and_the_training_goes_on(trained: Captured,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    from tracker.integrations.ultralytics_assign import attach, log_batch
    from tracker.integrations.ultralytics_loss import install

    model = DetectionModel("yolo11n.yaml", nc=4, verbose=False)
    model.args = get_cfg()
    install(model, None)
    probe = attach(model)

    def broken(args: Any, out: Any) -> None:
        raise IndexError("an assigner output this code does not know")

    probe.on_assign = broken  # type: ignore[method-assign]
    batch = {"img": torch.rand(1, 3, 64, 64), "batch_idx": torch.tensor([0.0]), "cls": torch.tensor([[1.0]]),
             "bboxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}
    total, items = model.loss(batch)
    assert torch.isfinite(total).all() and probe.failed and not probe.active
    assert "assignment statistics are off for this training: IndexError" in caplog.text
    log_batch(probe, None, 0, 1)  # nothing to write (run None would fail), and it stays off
    model.loss(batch)
    assert probe.stats is None and not probe.active
