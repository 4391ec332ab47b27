"""PyTorch interop, available as `jg.torch` (imported on first use, so jitgrad itself never needs torch).

`autograd_function(f)` wraps a traced function as a `torch.autograd.Function`: its forward runs
jitgrad's compiled fused forward and keeps the residuals, its backward runs the compiled fused
backward on them, so the function drops into a `torch.nn.Module`, `loss.backward()` and optimizers.
Tensors cross over without copies: CPU tensors are viewed as numpy arrays and results come back
as tensors sharing the arrays' memory.
"""
from __future__ import annotations

import re
from typing import Any, Callable

try:
    import torch
    from torch.autograd.function import once_differentiable
except ImportError as exc:  # torch is an optional dependency
    raise ImportError("jg.torch needs PyTorch; install it with `python -m pip install torch`") from exc

from jitgrad.front.api import Traced
from jitgrad.errors import InputError


def autograd_function(fn: Callable[..., Any] | Traced, name: str | None = None) -> type[torch.autograd.Function]:
    """A `torch.autograd.Function` subclass running `fn` with jitgrad; call it as `Cls.apply(*tensors)`.

    `fn` (a function or `jg.trace`d function) takes arrays and returns an array or a tuple of arrays.
    Inputs that do not require grad, and non-tensor inputs, get a None gradient. The backward is not
    itself differentiable by torch (double backward raises). `name` names the class (default: the
    function's name in CamelCase + "Function"); the class keeps the traced function as `traced`.
    """
    traced = fn if isinstance(fn, Traced) else Traced(fn)
    cls_name = name or "".join(p.capitalize() for p in re.sub(r"\W", "", traced.name).split("_")) + "Function"

    def forward(ctx: Any, *args: Any) -> Any:
        if not any(isinstance(a, torch.Tensor) for a in args):
            raise InputError(f"{cls_name}.apply: pass at least one torch tensor (got only arrays or numbers)")
        outputs, context = traced.forward(*args)
        if isinstance(outputs, list):
            outputs = tuple(outputs)
        leaves = outputs if isinstance(outputs, tuple) else (outputs,)
        if not all(isinstance(o, torch.Tensor) for o in leaves):
            got = "nested tuple" if isinstance(outputs, tuple) else type(outputs).__name__
            raise InputError(f"{cls_name}: {traced.name} must return an array or a flat tuple of arrays to be a "
                             f"torch autograd function, not a {got}")
        ctx.mark_non_differentiable(*[o for o in leaves if not o.is_floating_point()])
        ctx.jitgrad_context = context
        return outputs

    @once_differentiable
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = traced.backward(ctx.jitgrad_context, *[g.contiguous() for g in grad_outputs])
        return tuple(g if needed else None for g, needed in zip(grads, ctx.needs_input_grad))

    return type(cls_name, (torch.autograd.Function,), {
        "__doc__": f"torch.autograd.Function running {traced.name} with jitgrad's compiled forward and backward.",
        "__module__": getattr(traced.fn, "__module__", __name__),
        "traced": traced,
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
    })
