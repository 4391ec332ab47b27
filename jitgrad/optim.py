"""Optimizers over parameter pytrees, with torch.optim's hyperparameters and update rules: `SGD`, `Adam`, `AdamW`.

Functional: `state = opt.init(params)`, then `params, state = opt.update(params, grads, state)` returns new
arrays (nothing is changed in place). `update` is plain numpy on each leaf, so it runs eagerly and traces: put
it in a `@jg.trace`d step with `jg.value_and_grad` and the whole training step compiles into one program,
in which each leaf's update (its moments and the parameter) is one fused elementwise kernel.

Dtypes follow the parameters: the hyperparameters are Python floats (a numpy float64 given is turned into one,
so it never widens float32 arrays), and the scalars that depend on the step count (Adam's bias corrections,
SGD's first-step dampening) are computed in float64, as torch computes them in Python, then cast to each
leaf's dtype. A leaf whose gradient is None is left as it is (torch skips parameters without `.grad`); the
step count is one for the whole tree.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from jitgrad.errors import InputError
from jitgrad.tracing.trees import TreeDef, tree_flatten, tree_unflatten


class SGDState(NamedTuple):
    """SGD's state: the number of steps taken and the momentum buffers (None without momentum)."""

    step: Any
    momentum_buffer: Any


class AdamState(NamedTuple):
    """Adam's state: steps taken, first and second moments, and AMSGrad's running maximum (None without it)."""

    step: Any
    exp_avg: Any
    exp_avg_sq: Any
    max_exp_avg_sq: Any


def _dtype(leaf: Any) -> np.dtype:
    """A leaf's dtype: an array's (numpy or traced) or a Python number's."""
    dtype = getattr(leaf, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.result_type(leaf)


def _is_float(leaf: Any) -> bool:
    """Whether a leaf is a float array or number (the dtype's kind: np.issubdtype costs a microsecond a leaf)."""
    return _dtype(leaf).kind == "f"


def _zeros(params: Any) -> Any:
    """A tree like `params` with a zero array per float leaf and None for the others."""
    leaves, treedef = tree_flatten(params)
    return tree_unflatten(treedef, [np.zeros_like(p) if _is_float(p) else None for p in leaves])


_STATE_ADVICE = "pass the state {0}.init(params) made for these parameters (or the one the last update returned)"


def _leaves_like(treedef: TreeDef, tree: Any, what: str, owner: str, advice: str) -> list[Any]:
    """The subtrees of `tree` at the leaf positions of `treedef` (None where `tree` has None)."""
    try:
        return treedef.flatten_up_to(tree)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{owner}.update: {what} must have the structure of params, {treedef}: {str(exc).rstrip('.')}; "
                         f"{advice}") from exc


def _spec(leaf: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """A leaf's shape and dtype (an array's, numpy or traced, or a Python number's); None for anything else."""
    if isinstance(leaf, (int, float)):
        return (), np.result_type(leaf)
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    return None if shape is None or dtype is None else (tuple(shape), np.dtype(dtype))


def _same(a: Any, b: Any) -> bool:
    """Whether two leaves have one shape and one dtype (attribute reads for arrays: this runs every step)."""
    try:
        return a.shape == b.shape and a.dtype == b.dtype
    except AttributeError:
        return _spec(a) == _spec(b)


def _describe(leaf: Any) -> str:
    """How a message names a leaf: `float32[3]`, or its type where it is no array."""
    spec = _spec(leaf)
    return f"a {type(leaf).__name__}" if spec is None else f"{spec[1]}{list(spec[0])}"


def _checked_grads(treedef: TreeDef, params: list[Any], grads: Any, owner: str) -> list[Any]:
    """The gradient leaves, each of its parameter's shape and dtype (or None)."""
    found = _leaves_like(treedef, grads, "grads", owner, "pass one gradient (or None) per parameter")
    for k, (p, g) in enumerate(zip(params, found)):
        if g is None:
            continue
        if not _same(g, p):
            raise InputError(f"{owner}.update: the gradient at {list(treedef.paths()[k])} is {_describe(g)} "
                             f"but its parameter is {_describe(p)}; pass gradients of the parameters' "
                             f"shapes and dtypes (cast with .astype)")
        if not _is_float(p):
            raise InputError(f"{owner}.update: the parameter at {list(treedef.paths()[k])} is {_dtype(p)}, which "
                             f"has no gradient; only float leaves are optimised (its gradient must be None)")
    return found


def _checked_state(treedef: TreeDef, params: list[Any], tree: Any, what: str, owner: str) -> list[Any]:
    """The leaves of one state field (moments, momentum buffers), each of its float parameter's shape and dtype:
    a state made for other parameters would otherwise broadcast into them."""
    found = _leaves_like(treedef, tree, what, owner, _STATE_ADVICE.format(owner))
    for k, (p, s) in enumerate(zip(params, found)):
        if not _same(s, p) and (s is not None or _is_float(p)):
            raise InputError(f"{owner}.update: {what} at {list(treedef.paths()[k])} is {_describe(s)} "
                             f"but its parameter is {_describe(p)}; {_STATE_ADVICE.format(owner)}")
    return found


def _checked_step(state: Any, kind: type, owner: str) -> Any:
    """The state's step count, once the state is checked to be this optimizer's (`kind`) with a 0-d integer
    array step."""
    if not isinstance(state, kind):
        raise InputError(f"{owner}.update: state is a {type(state).__name__}, not a {kind.__name__}; "
                         f"{_STATE_ADVICE.format(owner)}")
    step = state.step
    spec = None if isinstance(step, (int, float)) else _spec(step)  # a Python number has no .astype
    if spec is None or spec[0] != () or spec[1].kind not in "iu":
        raise InputError(f"{owner}.update: state.step is {step!r} ({type(step).__name__}), not a 0-d integer "
                         f"array; {_STATE_ADVICE.format(owner)}")
    return step


def _real(owner: str, name: str, value: Any) -> float:
    """A hyperparameter as a Python float: a real number (Python's or numpy's, or a 0-d real array)."""
    if isinstance(value, numbers.Real) or isinstance(value, np.ndarray) and value.shape == () and \
            value.dtype.kind in "biuf":
        return float(value)
    raise InputError(f"{owner}: {name} must be a real number, got {value!r} ({type(value).__name__}); pass a Python "
                     f"float, a numpy scalar or a 0-d array (float(...) of a string or a one-element array)")


def _flag(owner: str, name: str, value: Any) -> bool:
    """A hyperparameter that switches a variant on or off, as a Python bool."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InputError(f"{owner}: {name} must be True or False, got {value!r} ({type(value).__name__})")


def _check_nonnegative(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value >= 0.0:
            raise InputError(f"{owner}: {name} must be >= 0, got {value}")


def _as_scalar(value: Any, dtype: np.dtype) -> Any:
    """A float64 step-dependent scalar cast to a leaf's dtype (so float32 leaves stay float32)."""
    return value.astype(dtype)


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent with torch.optim.SGD's momentum, dampening, Nesterov and L2 weight decay."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("lr", "momentum", "dampening", "weight_decay"):
            object.__setattr__(self, name, _real("SGD", name, getattr(self, name)))
        object.__setattr__(self, "nesterov", _flag("SGD", "nesterov", self.nesterov))
        _check_nonnegative("SGD", lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        if self.nesterov and (self.momentum <= 0.0 or self.dampening != 0.0):
            raise InputError(f"SGD: nesterov=True needs momentum > 0 and dampening 0, got momentum {self.momentum} "
                             f"and dampening {self.dampening}")

    def init(self, params: Any) -> SGDState:
        """The state before the first step: step 0 and zero momentum buffers (None when momentum is 0)."""
        return SGDState(np.zeros((), np.int64), _zeros(params) if self.momentum else None)

    def update(self, params: Any, grads: Any, state: SGDState) -> tuple[Any, SGDState]:
        """One step: the new parameters and state, as new arrays in the structure of `params`."""
        leaves, treedef = tree_flatten(params)
        grad_leaves = _checked_grads(treedef, leaves, grads, "SGD")
        step = _checked_step(state, SGDState, "SGD")
        buffers = _checked_state(treedef, leaves, state.momentum_buffer, "state.momentum_buffer", "SGD") \
            if self.momentum else [None] * len(leaves)
        scale = None
        if self.momentum and self.dampening:  # torch's first momentum step takes the gradient undamped
            first = (step == 0).astype(np.float64)
            scale = first + (1.0 - first) * (1.0 - self.dampening)
        rows = [(p, buf) if g is None else self._leaf(p, g, buf, scale)
                for p, g, buf in zip(leaves, grad_leaves, buffers)]
        new_params, new_buffers = ([row[i] for row in rows] for i in range(2))
        momentum_buffer = tree_unflatten(treedef, new_buffers) if self.momentum else None
        return tree_unflatten(treedef, new_params), SGDState(step + 1, momentum_buffer)

    def _leaf(self, p: Any, g: Any, buf: Any, scale: Any) -> tuple[Any, Any]:
        """One leaf's step (elementwise: one fused kernel when traced)."""
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            damped = g if scale is None else _as_scalar(scale, _dtype(p)) * g
            buf = self.momentum * buf + damped
            g = g + self.momentum * buf if self.nesterov else buf
        return p - self.lr * g, buf


@dataclass(frozen=True)
class Adam:
    """Adam as torch.optim.Adam: bias-corrected moments, L2 weight decay added to the gradient, optional AMSGrad."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    decoupled: ClassVar[bool] = False  # AdamW: weight decay multiplies the parameters instead

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("lr", "eps", "weight_decay"):
            object.__setattr__(self, field, _real(name, field, getattr(self, field)))
        object.__setattr__(self, "amsgrad", _flag(name, "amsgrad", self.amsgrad))
        if not isinstance(self.betas, (tuple, list, np.ndarray)) or np.ndim(self.betas) != 1 or len(self.betas) != 2:
            raise InputError(f"{name}: betas must be a pair (beta1, beta2), got {self.betas!r}; write e.g. "
                             f"betas=(0.9, 0.999)")
        object.__setattr__(self, "betas", tuple(_real(name, f"betas[{i}]", b) for i, b in enumerate(self.betas)))
        _check_nonnegative(name, lr=self.lr, eps=self.eps, weight_decay=self.weight_decay)
        for i, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise InputError(f"{name}: betas[{i}] must be in [0, 1), got {beta}")

    def init(self, params: Any) -> AdamState:
        """The state before the first step: step 0, zero moments (and zero running maximum with AMSGrad)."""
        return AdamState(np.zeros((), np.int64), _zeros(params), _zeros(params),
                         _zeros(params) if self.amsgrad else None)

    def update(self, params: Any, grads: Any, state: AdamState) -> tuple[Any, AdamState]:
        """One step: the new parameters and state, as new arrays in the structure of `params`."""
        name = type(self).__name__
        leaves, treedef = tree_flatten(params)
        grad_leaves = _checked_grads(treedef, leaves, grads, name)
        fields = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if self.amsgrad else ("exp_avg", "exp_avg_sq")
        step = _checked_step(state, AdamState, name) + 1
        moments = [_checked_state(treedef, leaves, getattr(state, f), f"state.{f}", name) for f in fields]
        moments += [[None] * len(leaves)] * (3 - len(fields))
        t = step.astype(np.float64)
        step_size = self.lr / (1.0 - self.betas[0] ** t)
        correction2_sqrt = np.sqrt(1.0 - self.betas[1] ** t)
        rows = [(p, m, v, v_max) if g is None else self._leaf(p, g, m, v, v_max, step_size, correction2_sqrt)
                for p, g, m, v, v_max in zip(leaves, grad_leaves, *moments)]
        new_params, exp_avg, exp_avg_sq, max_exp_avg_sq = (tree_unflatten(treedef, [row[i] for row in rows])
                                                            for i in range(4))
        return new_params, AdamState(step, exp_avg, exp_avg_sq, max_exp_avg_sq if self.amsgrad else None)

    def _leaf(self, p: Any, g: Any, m: Any, v: Any, v_max: Any, step_size: Any,
              correction2_sqrt: Any) -> tuple[Any, Any, Any, Any]:
        """One leaf's step (elementwise: one fused kernel when traced)."""
        beta1, beta2 = self.betas
        if self.weight_decay and self.decoupled:
            p = p * (1.0 - self.lr * self.weight_decay)
        elif self.weight_decay:
            g = g + self.weight_decay * p
        m = m + (1.0 - beta1) * (g - m)
        v = beta2 * v + (1.0 - beta2) * g * g
        if self.amsgrad:
            v_max = np.maximum(v_max, v)
        denom = np.sqrt(v_max if self.amsgrad else v) / _as_scalar(correction2_sqrt, _dtype(p)) + self.eps
        return p - _as_scalar(step_size, _dtype(p)) * (m / denom), m, v, v_max


@dataclass(frozen=True)
class AdamW(Adam):
    """AdamW as torch.optim.AdamW: Adam whose weight decay multiplies the parameters by (1 - lr * weight_decay)."""

    weight_decay: float = 1e-2
    decoupled: ClassVar[bool] = True


__all__ = ["SGD", "Adam", "AdamState", "AdamW", "SGDState"]
