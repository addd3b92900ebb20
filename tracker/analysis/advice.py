"""What to do: the one line of advice each finding carries, fitted to the run's machine.

Rules:

* :func:`precision_hint` is the advice for a NaN/inf loss. It reads the run's config
  (does it compute in float16? :func:`~tracker.analysis.params.uses_float16`) and the
  GPUs the run recorded (``run.json``'s ``gpus``, :mod:`tracker.hardware`):

  - a card on which float16 AMP is known to give NaN losses or zero mAP (GTX 16xx,
    T400-T2000, K40m: :data:`tracker.hardware.AMP_NAN_CARDS`) -> turn AMP off
    (``amp=False``, float32), as Ultralytics does there;
  - compute capability 8.0 or newer -> bfloat16 (float32's range);
  - an older card (Turing T4/RTX 20xx, Volta, Pascal) -> float32 or AMP off, or keep
    float16 with dynamic loss scaling: it has no bfloat16;
  - no recorded GPU (an imported run) -> the line names both cases.

  Ultralytics' ``amp`` is float16 only, so for an Ultralytics config the bfloat16
  branch also says ``amp=False``. A run imported from Ultralytics without its
  ``args.yaml`` is taken to have trained with Ultralytics' default, ``amp=True``.
* Every other advice line is a constant of :data:`ADVICE`, keyed by finding kind.
"""

from __future__ import annotations

from typing import Any, Mapping

from tracker.analysis.params import uses_float16
from tracker.hardware import AMP_NAN_CARDS, BF16_CAPABILITY, capability_of, recorded_gpus

ADVICE: dict[str, str] = {
    "overfitting": (
        "keep the weights of the best epoch; add data or augmentation, regularise "
        "(weight decay, dropout), or stop earlier (early-stopping patience)"
    ),
    "metric_collapse": (
        "check the validation labels and class names against the training set; "
        "a metric that never leaves 0 usually means the model predicts nothing the labels can match"
    ),
    "head_never_learnt": (
        "check this head's part of the labels (present in every label file, normalised to 0-1) and that its loss "
        "gain in the training settings is above 0"
    ),
    "head_never_learnt_pose": (
        "check the keypoint labels: kpt_shape in the data YAML must match the label files (x y, or x y visibility, "
        "per keypoint, normalised to 0-1, not every keypoint invisible), flip_idx its keypoint count, and the pose "
        "and kobj gains above 0"
    ),
    "head_never_learnt_mask": (
        "check the segment labels: polygons (class x1 y1 x2 y2 ...) rather than boxes in labels/, normalised to "
        "0-1, and the seg gain above 0"
    ),
    "zero_loss": (
        "no target ever reached this loss: check that every image has its label file "
        "(labels/ next to images/), that class ids are below nc and that boxes are normalised to 0-1"
    ),
    "zero_loss_val": (
        "the validation images have no targets: check the val split's label files (labels/ next to images/) "
        "and that data.yaml's val path points at the labelled images"
    ),
    "zero_loss_uncomputed": (
        "the validation did not compute its losses: validate with a current ultralytics release "
        "(model.val() on a checkpoint) to get them, and judge this run on its metrics meanwhile"
    ),
    "val_losses_absent": (
        "judge this run on its metrics; for validation losses, train a GELAN model (train.py) or run "
        "val_dual.py with its loss line enabled"
    ),
    "stopped_early": (
        "resume from the last checkpoint (Ultralytics resume=True) to finish the schedule, "
        "or accept the best epoch if early stopping ended it"
    ),
    "divergence": "lower the learning rate, lengthen the warmup or clip gradients",
    "diverging": "lower the learning rate, lengthen the warmup or clip gradients",
    "plateaued": "lower the learning rate, or stop if this is as good as it gets",
    "non_finite_fp32": "check the learning rate, this step's batch, and the loss for log(0) or division by zero",
}


def _is_ultralytics(config: Mapping[str, Any]) -> bool:
    return "amp" in config and ("imgsz" in config or "model" in config and "data" in config)


def _card(gpu: Mapping[str, Any]) -> str:
    cap = capability_of(gpu)
    name = str(gpu.get("name") or "the GPU")
    return f"{name} (compute capability {cap:.1f})" if cap is not None else name


def precision_hint(config: Mapping[str, Any] | None, environment: Mapping[str, Any] | None) -> str:
    """The advice for a NaN/inf value, fitted to the run's precision and recorded GPU (see module doc)."""
    config = dict(config or {})
    source = (environment or {}).get("imported_from")
    amp_by_default = isinstance(source, Mapping) and source.get("kind") == "ultralytics" and "amp" not in config
    if not uses_float16(config) and not amp_by_default:
        return ADVICE["non_finite_fp32"]
    ultra = amp_by_default or _is_ultralytics(config)
    gpus = recorded_gpus(environment)
    if not gpus:
        off = "amp=False" if ultra else "AMP off"
        what = ("Ultralytics trains in float16 AMP unless amp=False" if amp_by_default
                else "the run trains in float16/AMP (range ends at 65504)")
        return (
            f"{what}: on a GPU with bfloat16 (compute capability 8.0+: A100, RTX 30xx and newer) train in "
            f"bfloat16; on older cards (GTX 16xx, T4/RTX 20xx, V100, Pascal) train in float32 ({off}) or "
            "keep dynamic loss scaling (torch.amp.GradScaler)"
        )
    gpu = gpus[0]
    cap = capability_of(gpu)
    if AMP_NAN_CARDS.search(str(gpu.get("name") or "")):
        return (
            f"{_card(gpu)} is a card on which float16 AMP gives NaN losses or zero mAP: train in float32 "
            "(Ultralytics amp=False, which Ultralytics itself sets on these cards)"
        )
    if cap is not None and cap >= BF16_CAPABILITY:
        there = "; Ultralytics' amp is float16 only, so there set amp=False" if ultra else ""
        return (
            f"{_card(gpu)} supports bfloat16 (float32's range): train in bfloat16 "
            f"(torch.autocast(dtype=torch.bfloat16), Lightning precision='bf16-mixed'){there}"
        )
    if cap is not None:
        off = "amp=False" if ultra else "AMP off"
        return (
            f"{_card(gpu)} has no bfloat16: train in float32 ({off}) or keep float16 with dynamic loss "
            "scaling (torch.amp.GradScaler)"
        )
    return (
        f"{_card(gpu)}: if it supports bfloat16 (compute capability 8.0+) train in bfloat16, "
        "else train in float32 (AMP off)"
    )
