"""PyTorch interop: traced functions take CPU tensors and give tensors back; `jg.torch.autograd_function`
is a torch.autograd.Function that passes gradcheck and trains inside an nn.Module like pure torch."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.runtime import arguments

from scripts import load_script


def swish_rms_norm(x, weight):
    """x * sigmoid(x), then RMS-normalised over the last axis and scaled."""
    h = x * jg.sigmoid(x)
    return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-6) * weight


def swish_rms_norm_torch(x, weight):
    h = torch.nn.functional.silu(x)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


SwishRMSNorm = jg.torch.autograd_function(swish_rms_norm)


def scaled_tanh_and_sign(x, w, k):
    """Two outputs (a float one and a bool one) and a Python-number argument."""
    return np.tanh(x * w) * k, x > 0


def test_importing_jitgrad_does_not_import_torch() -> None:
    code = "import sys, jitgrad; assert 'torch' not in sys.modules; jitgrad.torch; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_traced_functions_take_tensors_and_return_tensors_of_their_dtype() -> None:
    f = jg.trace(lambda x, w: np.sum(np.exp(x) * w))
    x = torch.linspace(-1, 1, 7, requires_grad=True)  # float32, and requiring grad: detached, not copied
    w = torch.arange(7.0)
    value, (gx, gw) = f.value_and_grad(x, w, argnums=(0, 1))
    assert isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.shape == ()
    assert isinstance(gx, torch.Tensor) and gx.dtype == torch.float32
    torch.testing.assert_close(gx, torch.exp(x.detach()) * w)
    torch.testing.assert_close(gw, torch.exp(x.detach()))
    out = f(x.detach().double(), w.double())
    assert out.dtype == torch.float64
    out, ctx = f.forward(x, w)
    grads = f.backward(ctx, torch.tensor(2.0))
    torch.testing.assert_close(grads[0], 2 * gx)
    assert f(x.detach().numpy(), w.numpy()).dtype == np.float32  # numpy in, numpy out


def test_tensor_arguments_are_viewed_not_copied() -> None:
    t = torch.arange(6.0).reshape(2, 3).t()  # non-contiguous
    (viewed,), was_tensor = arguments.numpy_args((t,), "f")
    assert was_tensor and np.shares_memory(viewed, t.numpy()) and viewed.strides == t.numpy().strides
    np.testing.assert_array_equal(jg.trace(lambda a: a * 2)(t).numpy(), 2 * t.numpy())


def test_tensors_jitgrad_cannot_take_raise_input_errors() -> None:
    f = jg.trace(lambda a: a + 1)
    with pytest.raises(jg.InputError, match="argument 0 is a torch tensor on meta"):
        f(torch.empty(3, device="meta"))
    with pytest.raises(jg.InputError, match="bfloat16"):
        f(torch.ones(3, dtype=torch.bfloat16))


def test_wrapped_function_passes_torch_gradcheck() -> None:
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SwishRMSNorm.apply, (x, weight))
    two_outputs = jg.torch.autograd_function(scaled_tanh_and_sign)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: two_outputs.apply(a, b, 3.0)[0], (x, w))


def test_backward_gives_none_to_inputs_without_grad_and_non_tensors() -> None:
    fn = jg.torch.autograd_function(scaled_tanh_and_sign)
    assert fn.__name__ == "ScaledTanhAndSignFunction" and issubclass(fn, torch.autograd.Function)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64)
    y, positive = fn.apply(x, w, 2.0)
    assert y.requires_grad and not positive.requires_grad and positive.dtype == torch.bool
    gx, gw, gk = y.grad_fn.apply(torch.ones_like(y), torch.zeros_like(positive))
    assert gw is None and gk is None
    torch.testing.assert_close(gx, 2 * w * (1 - torch.tanh(x.detach() * w) ** 2))
    y.sum().backward(retain_graph=True)  # jitgrad's backward may run again on the same residuals
    y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * gx)
    assert w.grad is None


def test_misuse_raises_input_errors() -> None:
    nested = jg.torch.autograd_function(lambda x: {"y": x * 2})
    with pytest.raises(jg.InputError, match="flat tuple of arrays to be a torch autograd function, not a dict"):
        nested.apply(torch.ones(3, requires_grad=True))
    with pytest.raises(jg.InputError, match="at least one torch tensor"):
        SwishRMSNorm.apply(np.ones((2, 3)), np.ones(3))


def test_double_backward_raises() -> None:
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(SwishRMSNorm.apply(x, torch.ones(3, dtype=torch.float64)).sum(), x,
                                create_graph=True)
    with pytest.raises(RuntimeError):
        gx.sum().backward()


class Net(torch.nn.Module):
    """Linear -> swish + RMS norm block -> Linear; the block is jitgrad's Function or pure torch."""

    def __init__(self, use_jitgrad: bool):
        super().__init__()
        self.use_jitgrad = use_jitgrad
        self.inp = torch.nn.Linear(6, 8)
        self.norm_weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = SwishRMSNorm.apply(h, self.norm_weight) if self.use_jitgrad else swish_rms_norm_torch(h, self.norm_weight)
        return self.out(h)


def test_training_steps_in_a_module_match_pure_torch() -> None:
    torch.manual_seed(0)
    nets = [Net(use_jitgrad=True).double(), Net(use_jitgrad=False).double()]
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers = [torch.optim.SGD(n.parameters(), lr=0.1, momentum=0.9) for n in nets]
    x = torch.randn(16, 6, dtype=torch.float64)
    labels = torch.randint(0, 3, (16,))
    for _ in range(3):
        losses = []
        for net, opt in zip(nets, optimizers):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), labels)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-12)
        for (name, p), q in zip(nets[0].named_parameters(), nets[1].parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6, msg=name)
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)


def test_torch_module_benchmark_checks_agreement_and_times_both_variants() -> None:
    bench = load_script("bench/torch_module.py", "jitgrad_bench_torch_module")
    for block in bench.BLOCKS:
        s = bench.setup(block, batch=8, features=32, classes=3)
        assert s.jitgrad[1].apply_block == bench.FUNCTIONS[block].apply  # only the block differs
        assert s.eager[1].apply_block is bench.BLOCKS[block].eager
        assert bench.check_agreement(s) < 1e-4
    results = bench.measure("silu_rmsnorm", batch=8, features=32, classes=3, repeats=2, warmup=1)
    assert set(results) == {"block forward+backward", "full training step"}
    assert all(r["eager"] > 0 and r["jitgrad"] > 0 for r in results.values())
