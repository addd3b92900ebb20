"""Loss terms, their kernels, and the calls that pick one.

A :class:`LossTerm` is a name, a float64 numpy reference implementation and a
parameter schema. A :class:`Kernel` is a fast implementation of a term on one
backend (``numpy``, ``torch``, ``vulkan``, ...). Plugins register both through
``tracker_register_losses`` and ``tracker_register_kernels``.

Rules every kernel (and every reference) follows, checked by
:mod:`tracker.testing`:

* it is called as ``fn(logits, targets, grad, **resolved)`` with C-contiguous 2-D
  ``(N, C)`` arrays of one of ``kernel.dtypes`` (targets of the logits' dtype or
  float32), ``grad`` None or a C-contiguous ``(N, C)`` float32/float64 array, and
  the keyword parameters the term resolved (``reduction`` always among them); an
  unknown keyword raises;
* it ADDS dL/dlogits into ``grad`` (``grad += g``, never ``grad[...] = g``): a
  logits buffer that feeds several terms must receive the sum of their gradients;
* it returns a :class:`LossResult`; ``N == 0`` gives loss 0.0, zero vectors and an
  untouched ``grad``.

Input handling in :func:`loss` calls: logits and targets of shape ``(..., C)``
(numpy arrays, ml_dtypes bfloat16 arrays or torch tensors) are flattened to
``(N, C)``. Logits must be float16, bfloat16, float32 or float64; targets may be
any real or boolean dtype and are cast to the logits' dtype (or float32) when
needed. An input whose dtype the chosen kernel does not list is converted to
float32 first. ``grad`` must be a writeable C-contiguous float32/float64 numpy
array (or CPU torch tensor, written through its shared memory) of the logits'
shape.

Pair terms (``LossTerm.inputs`` ``views`` or ``student_teacher``: two embedding
views, or student and teacher logits, with a gradient pair) follow the rules of
:mod:`tracker.pairterms` instead of the two above.

``backend="auto"`` tries the registered kernels of the term in the order of
:data:`BACKEND_PREFERENCE` (then any other backend, by name), taking the first
whose ``available()`` returns None; the float64 reference serves a term that has
no usable kernel. ``backend="reference"`` always calls the reference. The order
is vulkan, numpy, torch: kernels receive numpy arrays on the host, and on those
the threaded, chunked numpy kernels beat torch's CPU kernels (``bench/losses.py``
measures both); torch stays a named choice.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tracker.errors import ConfigError, PluginError

REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
BACKEND_PREFERENCE: tuple[str, ...] = ("vulkan", "numpy", "torch")
REFERENCE = "reference"
PARAM_KINDS: tuple[str, ...] = ("float", "str", "vector", "float_or_vector")
# What a term's two inputs are: logits and targets (N, C), two embedding views (N, D), or
# student and teacher logits (N, K). The last two are pair terms: see tracker.pairterms.
INPUT_KINDS: tuple[str, ...] = ("logits", "views", "student_teacher")

KernelFn = Callable[..., "LossResult"]


@dataclass
class LossResult:
    """What a term call returns.

    ``loss``: float for reductions ``mean``/``sum``, an ``(..., C)`` float32 array
    for ``none``. ``per_class``: ``(C,)`` float64 per-class SUM of the weighted
    elementwise loss (before any mean division). ``positives``: ``(C,)`` int64
    count of target elements > 0 per class.
    """

    loss: Any
    per_class: np.ndarray
    positives: np.ndarray


@dataclass(frozen=True)
class Param:
    """One parameter of a loss term's schema.

    ``kind`` is one of ``float``, ``str``, ``vector`` (1-D finite floats) or
    ``float_or_vector``; ``None`` is always accepted and means "not given".
    """

    name: str
    kind: str
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    doc: str = ""

    def validate(self) -> None:
        """Raise PluginError when the schema entry itself is malformed."""
        if self.kind not in PARAM_KINDS:
            raise PluginError(
                f"parameter {self.name!r} has kind {self.kind!r}; expected one of {', '.join(PARAM_KINDS)}"
            )
        try:
            self.convert(self.default, "default of")
        except ConfigError as exc:
            raise PluginError(str(exc)) from None

    def convert(self, value: Any, where: str = "parameter") -> Any:
        """Check ``value`` against this entry; return it converted (float, str, float64 array)."""
        if value is None:
            return None
        if self.kind == "str":
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                raise ConfigError(f"{where} {self.name!r} is {value!r}; expected one of {', '.join(self.choices)}")
            return value
        if self.kind == "float" or (self.kind == "float_or_vector" and np.ndim(value) == 0):
            return self._number(value, where)
        return self._vector(value, where)

    def _number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ConfigError(f"{where} {self.name!r} is {value!r}; expected a number")
        number = float(value)
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        if not (low <= number <= high):
            raise ConfigError(f"{where} {self.name!r} is {number!r}; expected a number in [{low}, {high}]")
        return number

    def _vector(self, value: Any, where: str) -> np.ndarray:
        try:
            array = np.asarray(_to_numpy(value), dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} {self.name!r} is {value!r}; expected a 1-D vector of numbers") from None
        if array.ndim != 1:
            raise ConfigError(f"{where} {self.name!r} has shape {array.shape}; expected a 1-D vector of numbers")
        if not np.all(np.isfinite(array)):
            i = int(np.flatnonzero(~np.isfinite(array))[0])
            raise ConfigError(f"{where} {self.name!r}[{i}] is {float(array[i])!r}; expected finite numbers")
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        outside = np.flatnonzero((array < low) | (array > high))
        if outside.size:
            i = int(outside[0])
            raise ConfigError(f"{where} {self.name!r}[{i}] is {float(array[i])!r}; expected values in [{low}, {high}]")
        return array


REDUCTION_PARAM = Param("reduction", "str", "mean", REDUCTIONS, doc="mean over all N*C elements, sum, or none")


def _default_resolve(params: dict[str, Any], num_classes: int) -> dict[str, Any]:
    return dict(params)


def _default_examples(num_classes: int) -> list[dict[str, Any]]:
    return [{}]


@dataclass
class LossTerm:
    """A named loss term: a float64 reference, a parameter schema and a resolver.

    ``reference(logits, targets, grad, **resolved) -> LossResult`` follows the
    kernel rules with float64 accumulation. ``resolve(params, num_classes)`` turns
    the checked user parameters (every schema entry, defaults filled, plus
    ``reduction``) into the keyword arguments kernels receive. ``examples(C)``
    gives parameter sets the conformance checks exercise.

    ``inputs`` says what the two inputs are (:data:`INPUT_KINDS`); a pair term
    (``views``, ``student_teacher``) also names its loss ``components``, the
    ``reductions`` it supports, and whether it ``stops_gradient`` on its second
    input for given resolved parameters (see :mod:`tracker.pairterms`).
    """

    name: str
    reference: KernelFn
    params: tuple[Param, ...] = ()
    resolve: Callable[[dict[str, Any], int], dict[str, Any]] = _default_resolve
    examples: Callable[[int], Sequence[dict[str, Any]]] = _default_examples
    description: str = ""
    inputs: str = "logits"
    components: tuple[str, ...] = ()
    reductions: tuple[str, ...] = REDUCTIONS
    stops_gradient: Callable[[dict[str, Any]], bool] | None = None

    def validate(self) -> None:
        """Raise PluginError when the term is malformed (called by the host on register)."""
        if not callable(self.reference) or not callable(self.resolve) or not callable(self.examples):
            raise PluginError(f"loss term {self.name!r}: reference, resolve and examples must be callable")
        names = [p.name for p in self.params]
        if REDUCTION_PARAM.name in names or len(set(names)) != len(names):
            raise PluginError(
                f"loss term {self.name!r}: parameter names {names} must be unique and must not "
                "include 'reduction' (every term gets it)"
            )
        for param in self.params:
            if not isinstance(param, Param):
                raise PluginError(f"loss term {self.name!r}: parameter {param!r} is not a tracker.losses.Param")
            param.validate()
        if self.inputs != "logits" or self.components or self.reductions != REDUCTIONS:
            from tracker.pairterms import validate_pair_term

            validate_pair_term(self)

    def schema(self) -> dict[str, Param]:
        """Every parameter by name, ``reduction`` included."""
        reduction = REDUCTION_PARAM
        if self.reductions != REDUCTIONS:
            reduction = Param("reduction", "str", "mean", tuple(self.reductions), doc="the term's own reductions")
        return {p.name: p for p in (*self.params, reduction)}

    def check_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Check user parameters against the schema; return them converted, defaults filled."""
        schema = self.schema()
        unknown = sorted(set(params) - set(schema))
        if unknown:
            raise ConfigError(
                f"Unknown parameter {unknown[0]!r} for loss {self.name!r}; available: {', '.join(sorted(schema))}"
            )
        return {name: p.convert(params.get(name, p.default)) for name, p in schema.items()}

    def resolved(self, params: Mapping[str, Any], num_classes: int) -> dict[str, Any]:
        """Kernel keyword arguments for ``num_classes`` classes from checked ``params``."""
        resolved = dict(self.resolve(dict(params), num_classes))
        resolved["reduction"] = params["reduction"]
        return resolved

    def __call__(self, logits: Any, targets: Any, grad: Any = None, backend: str = "auto", **params: Any) -> LossResult:
        """Shortcut for ``loss(self.name, backend, **params)(logits, targets, grad)``."""
        return BoundLoss(self, backend, self.check_params(params))(logits, targets, grad)


@dataclass
class Kernel:
    """A fast implementation of loss term ``term`` on backend ``backend``.

    ``dtypes`` lists the logits dtypes ``fn`` accepts (float32 is required);
    ``available()`` returns None when the kernel can run here, else a one-line reason.
    """

    term: str
    backend: str
    fn: KernelFn
    dtypes: tuple[str, ...] = ("float32",)
    available: Callable[[], str | None] | None = None
    description: str = ""
    auto_min_elements: int = 0  # backend="auto" uses this kernel only for inputs at least this large

    @property
    def name(self) -> str:
        """The registry key ``"<term>/<backend>"``."""
        return f"{self.term}/{self.backend}"

    def validate(self) -> None:
        """Raise PluginError when the kernel is malformed (called by the host on register)."""
        if self.backend == REFERENCE:
            raise PluginError(f"kernel {self.name!r}: backend name {REFERENCE!r} is reserved for the term's reference")
        if not callable(self.fn):
            raise PluginError(f"kernel {self.name!r}: fn {self.fn!r} is not callable")
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad or "float32" not in self.dtypes:
            raise PluginError(
                f"kernel {self.name!r}: dtypes {self.dtypes!r} must include 'float32' and use only {', '.join(DTYPES)}"
            )

    def unavailable(self) -> str | None:
        """None when the kernel can run here, else why not (a raising check counts as a reason)."""
        if self.available is None:
            return None
        try:
            return self.available()
        except Exception as exc:
            return f"availability check raised {type(exc).__name__}: {exc}"


def reference_kernel(term: LossTerm) -> Kernel:
    """The term's float64 reference wrapped as a kernel of backend ``reference``."""
    return Kernel(term=term.name, backend=REFERENCE, fn=term.reference, dtypes=DTYPES)


def _host() -> Any:
    from tracker.host import get_host

    return get_host()


def losses() -> dict[str, LossTerm]:
    """Every registered loss term, by name (sorted)."""
    items = _host().items("losses")
    return {name: items[name] for name in sorted(items)}


def get_term(term: LossTerm | str) -> LossTerm:
    """The registered term called ``term`` (a LossTerm is returned as is)."""
    if isinstance(term, LossTerm):
        return term
    items = _host().items("losses")
    if term not in items:
        raise ConfigError(f"Unknown loss {term!r}; available: {', '.join(sorted(items)) or 'none'}")
    return items[term]


def kernels(term: LossTerm | str) -> dict[str, Kernel]:
    """The registered kernels of ``term``, by backend, in ``auto`` preference order."""
    name = term.name if isinstance(term, LossTerm) else term
    found = {k.backend: k for k in _host().items("kernels").values() if k.term == name}
    rank = {b: i for i, b in enumerate(BACKEND_PREFERENCE)}
    order = sorted(found, key=lambda b: (rank.get(b, len(rank)), b))
    return {b: found[b] for b in order}


def get_kernel(term: LossTerm | str, backend: str) -> Kernel:
    """The kernel of ``term`` on ``backend`` (``reference`` gives the reference); raises if unavailable."""
    loss_term = get_term(term)
    if backend == REFERENCE:
        return reference_kernel(loss_term)
    found = kernels(loss_term)
    if backend not in found:
        available = ", ".join([*found, REFERENCE])
        raise ConfigError(f"Unknown backend {backend!r} for loss {loss_term.name!r}; available: {available}, auto")
    reason = found[backend].unavailable()
    if reason:
        raise PluginError(f"Backend {backend!r} for loss {loss_term.name!r} is unavailable here: {reason}")
    return found[backend]


def auto_kernel(term: LossTerm | str, elements: int | None = None) -> Kernel:
    """The first available kernel of ``term`` in preference order, else its reference.

    With ``elements`` (the input's size), a kernel whose ``auto_min_elements`` is
    larger is passed over: launching a device kernel costs more than a small input.
    """
    loss_term = get_term(term)
    for kernel in kernels(loss_term).values():
        if elements is not None and elements < kernel.auto_min_elements:
            continue
        if kernel.unavailable() is None:
            return kernel
    return reference_kernel(loss_term)


def loss(name: str, backend: str = "auto", **params: Any) -> "BoundLoss":
    """A callable loss term: ``loss(name, backend, **params)(logits, targets, grad=None)``.

    Parameters are checked now against the term's schema; the kernel is chosen on
    the first call (``auto``) or now (a named backend, so a typo fails early).
    """
    term = get_term(name)
    bound = BoundLoss(term, backend, term.check_params(params))
    if backend != "auto":
        bound.kernel = get_kernel(term, backend)
    return bound


@dataclass
class BoundLoss:
    """A loss term bound to a backend and checked parameters; call it on inputs."""

    term: LossTerm
    backend: str
    params: dict[str, Any]
    kernel: Kernel | None = None
    _resolved: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _auto: dict[int, Kernel] = field(default_factory=dict, repr=False)

    def resolved(self, num_classes: int) -> dict[str, Any]:
        """The kernel keyword arguments for ``num_classes`` classes (cached)."""
        if num_classes not in self._resolved:
            self._resolved[num_classes] = self.term.resolved(self.params, num_classes)
        return self._resolved[num_classes]

    def __call__(self, logits: Any, targets: Any, grad: Any = None) -> LossResult:
        """Compute the loss; when ``grad`` is given, ADD dL/dlogits into it."""
        if self.backend == "auto":
            kernel = self._auto.get(_bucket(logits))
            if kernel is None:
                kernel = self._auto[_bucket(logits)] = auto_kernel(self.term, _elements(logits))
        else:
            if self.kernel is None:
                self.kernel = get_kernel(self.term, self.backend)
            kernel = self.kernel
        if self.term.inputs != "logits":
            from tracker.pairterms import call_pair

            return call_pair(self, kernel, logits, targets, grad)
        x, y, g, shape = prepare_inputs(logits, targets, grad, kernel.dtypes)
        resolved = self.resolved(shape[-1])
        result = kernel.fn(x, y, g, **resolved)
        if resolved["reduction"] == "none":
            result.loss = np.asarray(result.loss, dtype=np.float32).reshape(shape)
        return result


def _elements(value: Any) -> int:
    return int(np.prod(getattr(value, "shape", np.shape(value)), dtype=np.int64))


def _bucket(value: Any) -> int:
    """The auto choice is cached per power of two of the input size."""
    return _elements(value).bit_length()


def _to_numpy(value: Any) -> Any:
    """A torch tensor as a numpy array (zero-copy on CPU); anything else as is.

    bfloat16 tensors become ml_dtypes bfloat16 arrays, or float32 copies when
    ml_dtypes is not installed.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return value
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            return tensor.float().numpy()
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def dtype_name(dtype: np.dtype) -> str:
    """``np.dtype`` name, with ml_dtypes' bfloat16 spelled ``bfloat16``."""
    return str(np.dtype(dtype).name)


def _logits_array(logits: Any, kernel_dtypes: Sequence[str]) -> np.ndarray:
    x = _to_numpy(logits)
    if not isinstance(x, np.ndarray):
        x = np.asarray(x, dtype=np.float32) if not hasattr(x, "dtype") else np.asarray(x)
    name = dtype_name(x.dtype)
    if name not in DTYPES:
        raise ConfigError(
            f"logits dtype {name} is not supported; expected one of {', '.join(DTYPES)} (cast with .astype(np.float32))"
        )
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ConfigError(f"logits shape {x.shape} has no class axis; expected (..., C) with C >= 1")
    if name not in kernel_dtypes:
        x = x.astype(np.float32)
    return np.ascontiguousarray(x)


def _targets_array(targets: Any, x: np.ndarray) -> np.ndarray:
    y = _to_numpy(targets)
    y = y if isinstance(y, np.ndarray) else np.asarray(y)
    if y.shape != x.shape:
        raise ConfigError(f"targets shape {y.shape} does not match logits; expected {x.shape}")
    kind = y.dtype.kind
    if kind not in "biuf" and dtype_name(y.dtype) != "bfloat16":
        raise ConfigError(f"targets dtype {y.dtype} is not numeric; expected a float, integer or bool array")
    if y.dtype != x.dtype and y.dtype != np.float32:
        y = y.astype(np.float64 if x.dtype == np.float64 else np.float32)
    return np.ascontiguousarray(y)


def _grad_array(grad: Any, shape: tuple[int, ...]) -> np.ndarray:
    g = _to_numpy(grad)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(grad, torch.Tensor) and grad.device.type != "cpu":
        raise ConfigError(f"grad is a torch tensor on {grad.device}; expected a CPU tensor or a numpy array")
    if not isinstance(g, np.ndarray):
        raise ConfigError(f"grad is a {type(grad).__name__}; expected a numpy float32/float64 array of shape {shape}")
    if g.dtype not in (np.float32, np.float64):
        raise ConfigError(f"grad dtype {g.dtype} is not supported; expected float32 or float64")
    if g.shape != shape:
        raise ConfigError(f"grad shape {g.shape} does not match logits; expected {shape}")
    if not g.flags.c_contiguous or not g.flags.writeable:
        raise ConfigError(
            "grad must be a writeable C-contiguous array (the loss adds into it in place); "
            "pass np.ascontiguousarray(grad) and read the gradient from that array"
        )
    return g


def prepare_inputs(
    logits: Any, targets: Any, grad: Any, kernel_dtypes: Sequence[str] = DTYPES
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[int, ...]]:
    """Check and flatten inputs to ``(N, C)``; return ``(x, y, grad_or_None, original_shape)``."""
    x = _logits_array(logits, kernel_dtypes)
    shape = tuple(x.shape)
    y = _targets_array(targets, x)
    g = None if grad is None else _grad_array(grad, shape)
    num_classes = shape[-1]
    x2, y2 = x.reshape(-1, num_classes), y.reshape(-1, num_classes)
    return x2, y2, (None if g is None else g.reshape(-1, num_classes)), shape


def reduce_elementwise(
    elementwise: np.ndarray,
    gradient: np.ndarray | None,
    targets: np.ndarray,
    grad: np.ndarray | None,
    reduction: str,
) -> LossResult:
    """Finish a float64 reference: apply ``reduction``, ADD the scaled gradient into ``grad``.

    ``elementwise`` is the ``(N, C)`` weighted loss, ``gradient`` the derivative of
    its sum (skipped when ``grad`` is None).
    """
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    n, c = elementwise.shape
    per_class = elementwise.sum(axis=0, dtype=np.float64)
    positives = np.count_nonzero(targets > 0, axis=0).astype(np.int64)
    scale = 1.0 / (n * c) if reduction == "mean" and n else 1.0
    if grad is not None and gradient is not None and n:
        grad += gradient * scale
    if reduction == "none":
        value: Any = elementwise.astype(np.float32)
    else:
        value = float(per_class.sum() * scale)
    return LossResult(loss=value, per_class=per_class, positives=positives)


def check_gamma(gamma: float) -> None:
    """ConfigError unless the focusing exponent ``gamma`` of a focal kernel is a number >= 0."""
    if not gamma >= 0.0:
        raise ConfigError(f"gamma is {gamma!r}; expected a number >= 0")


class _LossesModule(types.ModuleType):
    """This module, callable as :func:`losses`.

    ``tracker.losses`` names both this module and the function listing the terms;
    importing the module makes the package attribute the module, so calling it
    must still list the terms.
    """

    def __call__(self) -> dict[str, LossTerm]:
        return losses()


sys.modules[__name__].__class__ = _LossesModule
