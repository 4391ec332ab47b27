"""Small outputs of a settled call are recycled (`jitgrad.kernels.recycled`, issue 36): a result the caller still
holds, or any view of one, is never overwritten; one the caller dropped is reused (the same array object comes back);
with pooling off nothing is kept. Asserted on results and object identity; no timing."""
from __future__ import annotations

import gc
import weakref

import numpy as np

import jitgrad as jg
from jitgrad.kernels.build import compiler
from test_repeat_calls import check_w1, w1 as loss

rng = np.random.default_rng(3636)


def settled(f, args):
    """`f` after its value-and-grad has settled (kernels on their full-level serial code: the generated call)."""
    for _ in range(3):
        f.value_and_grad(*args, argnums=(0, 1, 2))
    compiler.wait_for_background_compiles()
    for _ in range(3):
        f.value_and_grad(*args, argnums=(0, 1, 2))
    plan = f.plan(*args)
    (exe, _, _), = [v for k, v in plan.executables.items() if k[0] == "value_and_grad"]
    assert exe.settled
    return f


def inputs(n=16):
    return tuple(rng.standard_normal(n).astype(np.float32) for _ in range(3))


def copied(result):
    value, grads = result
    return value.copy(), [g.copy() for g in grads]


def test_held_results_and_views_are_never_overwritten_and_dropped_ones_come_back() -> None:
    f = settled(jg.trace(loss), inputs())
    held: list[tuple] = []  # (result or a view of one of its gradients, its values when returned)
    for step in range(60):
        args = inputs()
        result = f.value_and_grad(*args, argnums=(0, 1, 2))
        check_w1(result, args)
        choice = rng.integers(3)
        if choice == 1:
            held.append((result, copied(result)))
        elif choice == 2:
            view = result[1][step % 3][1:].reshape(3, 5)
            held.append((view, view.copy()))
        del result
        if held and rng.integers(2):
            held.pop(int(rng.integers(len(held))))
        for kept, values in held:
            if isinstance(kept, tuple):
                assert kept[0] == values[0]
                for a, b in zip(kept[1], values[1]):
                    np.testing.assert_array_equal(a, b)
            else:
                np.testing.assert_array_equal(kept, values)


def test_a_dropped_result_is_the_array_a_later_call_returns() -> None:
    args = inputs()
    f = settled(jg.trace(loss), args)
    before = f.value_and_grad(*args, argnums=(0, 1, 2))[1][0]
    last = f.value_and_grad(*args, argnums=(0, 1, 2))  # held while the next calls run, as a training loop does
    ref = weakref.ref(before)
    del before
    again = [f.value_and_grad(*args, argnums=(0, 1, 2))[1][0] for _ in range(2)]
    assert ref() is not None and any(g is ref() for g in again)
    assert all(g is not last[1][0] for g in again)  # the held result is not handed out again


def test_with_pooling_off_no_result_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_BUFFER_POOL_MB", "0")
    args = inputs()
    f = settled(jg.trace(loss), args)
    refs = [weakref.ref(f.value_and_grad(*args, argnums=(0, 1, 2))[1][0]) for _ in range(4)]
    gc.collect()
    assert all(r() is None for r in refs)
    assert "refcount(" not in f.plans.repeats[("value_and_grad", (0, 1, 2), None, False)][0].run.source
