"""jg.optim against torch.optim step by step on the same numbers, over nested parameter pytrees; dtypes kept;
a fused training step (value_and_grad and the update traced together) compiled into one program."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import jitgrad as jg

torch = pytest.importorskip("torch")

STEPS = 20
TOLERANCE = 1e-5  # max over leaves and steps of max|jitgrad - torch| / max|torch|, float32

CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.05}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("Adam", {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    ("AdamW", {"lr": 1e-2}),
    ("AdamW", {"lr": 3e-2, "betas": (0.85, 0.95), "weight_decay": 0.5, "amsgrad": True}),
]
TORCH_STATE = {"SGD": {"momentum_buffer": "momentum_buffer"},
               "Adam": {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "max_exp_avg_sq": "max_exp_avg_sq"}}


def nested_params(dtype: type = np.float32, seed: int = 0) -> dict:
    """Parameters as a nested pytree: dicts, a list and a tuple."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return np.asarray(rng.standard_normal(shape), dtype)

    return {"layer": {"w": normal(5, 4), "b": normal(4)}, "extra": [normal(3), (normal(2, 2, 2),)], "scale": normal()}


def fake_grad(p: np.ndarray, step: int) -> np.ndarray:
    """A gradient of p's dtype that depends on p and on the step (seeded noise plus a pull towards zero)."""
    noise = np.random.default_rng([step, p.size]).standard_normal(p.shape)
    return np.asarray(0.5 * p + noise.astype(p.dtype), p.dtype)


def relative_error(mine: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.max(np.abs(mine - theirs)) / np.max(np.abs(theirs)))


def torch_state_leaves(opt: torch.optim.Optimizer, tensors: list, name: str) -> list[np.ndarray]:
    return [opt.state[t][name].numpy() for t in tensors]


@pytest.mark.parametrize("name,hyper", CASES, ids=[f"{n}-{'-'.join(map(str, h))}" for n, h in CASES])
def test_matches_torch_optim_over_20_steps_on_a_nested_pytree(name: str, hyper: dict) -> None:
    opt = getattr(jg.optim, name)(**hyper)
    params = nested_params()
    state = opt.init(params)
    tensors = [torch.tensor(p, requires_grad=True) for p in jg.tree_leaves(params)]
    reference = getattr(torch.optim, name)(tensors, **hyper)
    worst = 0.0
    for step in range(STEPS):
        params, state = opt.update(params, jg.tree_map(lambda p, step=step: fake_grad(p, step), params), state)
        for t in tensors:
            t.grad = torch.from_numpy(fake_grad(t.detach().numpy(), step))
        reference.step()
        for mine, theirs in zip(jg.tree_leaves(params), tensors):
            assert mine.dtype == np.float32
            worst = max(worst, relative_error(mine, theirs.detach().numpy()))
    assert worst <= TOLERANCE, f"{name}{hyper}: parameters differ from torch by {worst:.2e}"
    assert int(state.step) == STEPS
    for field, torch_name in TORCH_STATE["SGD" if name == "SGD" else "Adam"].items():
        tree = getattr(state, field)
        if tree is None:
            continue
        for mine, theirs in zip(jg.tree_leaves(tree), torch_state_leaves(reference, tensors, torch_name)):
            assert mine.dtype == np.float32 and relative_error(mine, theirs) <= TOLERANCE, field


@pytest.mark.parametrize("name,hyper", [CASES[3], CASES[6], CASES[8]], ids=["SGD", "Adam", "AdamW"])
def test_float_dtypes_are_kept_whatever_the_hyperparameters_types(name: str, hyper: dict) -> None:
    hyper = {k: (np.float64(v) if isinstance(v, float) else v) for k, v in hyper.items()}  # numpy float64 scalars
    opt = getattr(jg.optim, name)(**hyper)
    assert type(opt.lr) is float  # a numpy float64 lr would widen float32 arrays: kept as a Python float
    for dtype in (np.float32, np.float64):
        params = nested_params(dtype)
        state = opt.init(params)
        for step in range(3):
            params, state = opt.update(params, jg.tree_map(lambda p, step=step: fake_grad(p, step), params), state)
        for tree in (params, *[t for t in state[1:] if t is not None]):
            assert {leaf.dtype for leaf in jg.tree_leaves(tree)} == {np.dtype(dtype)}
        assert state.step.dtype == np.int64


def test_update_returns_new_arrays_in_the_params_structure() -> None:
    opt = jg.optim.Adam(1e-2)
    params = nested_params()
    before = jg.tree_map(np.copy, params)
    state = opt.init(params)
    new, new_state = opt.update(params, jg.tree_map(lambda p: fake_grad(p, 0), params), state)
    assert jg.tree_structure(new) == jg.tree_structure(params)
    assert jg.tree_structure(new_state.exp_avg) == jg.tree_structure(params)
    for old, kept in zip(jg.tree_leaves(params), jg.tree_leaves(before)):
        np.testing.assert_array_equal(old, kept)  # nothing changed in place
    assert all(not np.shares_memory(a, b) for a, b in zip(jg.tree_leaves(new), jg.tree_leaves(params)))
    assert all(np.all(m == 0) for m in jg.tree_leaves(state.exp_avg))


def test_none_gradients_and_integer_leaves_are_left_alone() -> None:
    opt = jg.optim.SGD(0.1, momentum=0.9)
    params = {"w": np.ones(3, np.float32), "count": np.arange(2), "frozen": np.ones(2, np.float32)}
    state = opt.init(params)
    assert state.momentum_buffer["count"] is None
    grads = {"w": np.ones(3, np.float32), "count": None, "frozen": None}
    new, state = opt.update(params, grads, state)
    np.testing.assert_allclose(new["w"], 0.9)
    assert new["count"] is params["count"] and new["frozen"] is params["frozen"]


def test_mistakes_raise_jitgrad_errors_that_say_what_to_do() -> None:
    opt = jg.optim.Adam()
    params = {"w": np.ones(3, np.float32)}
    state = opt.init(params)
    with pytest.raises(jg.InputError, match="grads must have the structure of params"):
        opt.update(params, {"v": np.ones(3, np.float32)}, state)
    with pytest.raises(jg.InputError, match=r"gradient at \['w'\] is float64\[3\].*cast with .astype"):
        opt.update(params, {"w": np.ones(3)}, state)
    with pytest.raises(jg.InputError, match=r"float32\[2\] but its parameter is float32\[3\]"):
        opt.update(params, {"w": np.ones(2, np.float32)}, state)
    with pytest.raises(jg.InputError, match="nesterov=True needs momentum > 0"):
        jg.optim.SGD(0.1, nesterov=True)
    with pytest.raises(jg.InputError, match="lr must be >= 0"):
        jg.optim.AdamW(lr=-1.0)
    with pytest.raises(jg.InputError, match=r"betas\[1\] must be in \[0, 1\)"):
        jg.optim.Adam(betas=(0.9, 1.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.lr = 0.1  # a traced step bakes the hyperparameters in: changing them means a new optimizer


def mlp_loss(params: dict, x: np.ndarray, y: np.ndarray):
    hidden = np.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return np.mean((hidden @ params["out"][0] + params["out"][1] - y) ** 2)


def mlp_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"hidden": {"w": rng.standard_normal((6, 16)).astype(np.float32) * 0.5, "b": np.zeros(16, np.float32)},
            "out": [rng.standard_normal((16, 2)).astype(np.float32) * 0.5, np.zeros(2, np.float32)]}


def fused_step(opt):
    def step(params, state, x, y):
        loss, grads = jg.value_and_grad(mlp_loss)(params, x, y)
        params, state = opt.update(params, grads, state)
        return loss, params, state

    return jg.trace(step)


def torch_mlp_losses(params: dict, x: np.ndarray, y: np.ndarray, steps: int) -> tuple[list[float], list]:
    tensors = [torch.tensor(p, requires_grad=True) for p in jg.tree_leaves(params)]
    by_name = dict(zip(["hidden.b", "hidden.w", "out.0", "out.1"], tensors))  # leaves in sorted-key order
    opt = torch.optim.AdamW(tensors, lr=1e-2, weight_decay=0.1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        hidden = torch.tanh(xt @ by_name["hidden.w"] + by_name["hidden.b"])
        loss = torch.mean((hidden @ by_name["out.0"] + by_name["out.1"] - yt) ** 2)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [t.detach().numpy() for t in tensors]


def test_fused_training_step_compiles_into_one_program_and_matches_torch() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((32, 6)).astype(np.float32), rng.standard_normal((32, 2)).astype(np.float32)
    opt = jg.optim.AdamW(lr=1e-2, weight_decay=0.1)
    step = fused_step(opt)
    params = start = mlp_params()
    state = opt.init(params)
    losses = []
    for _ in range(STEPS):
        loss, params, state = step(params, state, x, y)
        losses.append(float(loss))
    info = step.cache_info()
    assert (info["misses"], info["hits"], info["entries"]) == (1, STEPS - 1, 1)  # traced once, one plan
    (plan,) = step.plans.plans.values()
    assert list(plan.executables) == ["call"]  # loss, gradients and update: one compiled program, run as one
    torch_losses, torch_params = torch_mlp_losses(start, x, y, STEPS)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5)
    for mine, theirs in zip(jg.tree_leaves(params), torch_params):
        assert mine.dtype == np.float32 and relative_error(mine, theirs) <= TOLERANCE
    assert int(state.step) == STEPS and state.max_exp_avg_sq is None


def test_each_leaf_update_is_one_fused_kernel_and_same_rank_leaves_share_code() -> None:
    opt = jg.optim.Adam(1e-3)
    params = {"a": np.ones(8, np.float32), "b": np.ones(9, np.float32), "c": np.ones(10, np.float32)}
    grads = jg.tree_map(lambda p: p * 0.5, params)
    update = jg.trace(opt.update)
    state = opt.init(params)
    # one scalar kernel for the bias corrections, then one kernel per leaf computing its m, v and p
    assert update.kernel_counts(params, grads, state)["call"] == 1 + len(params)
    text = update.explain(params, grads, state)
    call = text[text.index("# call:"):text.index("# call kernel")]
    for n in (8, 9, 10):
        assert re.search(rf"writes \['float32\[{n}\]', 'float32\[{n}\]', 'float32\[{n}\]'\]", call), call
    assert "kernels 1, 2, 3 share one compiled kernel" in call  # leaves of one rank: compiled once
