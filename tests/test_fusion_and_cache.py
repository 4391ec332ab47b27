"""Fusion is real (kernel counts) and the plan cache reuses compiled code (counters)."""
import numpy as np

import jitgrad as jg
from jitgrad.kernels.build import background, compiler


def loss(w, x, b):
    y = w * x + b
    return np.sum(np.exp(y) * 2 + np.tanh(x))


def _wxb(n, dtype=np.float32):
    rng = np.random.default_rng(n)
    return tuple(rng.random(n).astype(dtype) for _ in range(3))


def test_loss_is_one_forward_kernel_and_one_joint_kernel() -> None:
    f = jg.trace(loss)
    counts = f.kernel_counts(*_wxb(100))
    assert counts["call"] == 1
    assert counts["value_and_grad"] == 1  # forward and all three gradients in one pass
    text = f.explain(*_wxb(100))
    assert "# call: 1 kernel(s)" in text and "# value_and_grad: 1 kernel(s)" in text
    assert "def kernel_0(" in text and "prange" in text


def test_softmax_row_chain_is_one_multi_pass_kernel() -> None:
    f = jg.trace(lambda x: jg.softmax(x, axis=1))
    assert f.kernel_counts(np.ones((4, 6)))["call"] == 1
    assert "3 pass(es)" in f.explain(np.ones((4, 6)))


def test_second_call_compiles_nothing_and_new_length_reuses_kernels(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_QUICK_KERNELS", "0")  # a quick kernel's second call compiles in the background
    background.scheduler.wait()  # an earlier test's queued parallel variant must not compile during the calls
    f = jg.trace(loss)
    f.value_and_grad(*_wxb(50))
    before = compiler.stats()
    f.value_and_grad(*_wxb(50))
    assert compiler.stats() == before
    assert f.cache_info()["hits"] >= 1
    f.value_and_grad(*_wxb(77))  # same rank and dtypes, new length: a new plan, no new numba code
    after = compiler.stats()
    assert after["numba_compiles"] == before["numba_compiles"]
    assert after["sources"] == before["sources"]
    assert f.cache_info()["entries"] == 2


def test_large_inputs_answer_serially_while_the_parallel_kernel_compiles_in_the_background() -> None:
    def unusual(w, x, b):  # a kernel no other test compiles, so its parallel variant starts uncompiled
        return np.sum(np.exp(w * x + b) * np.arctan(x) * 3)

    f = jg.trace(unusual)
    w, x, b = _wxb(200_000)
    e = np.exp(w.astype(np.float64) * x + b) * np.arctan(x.astype(np.float64)) * 3
    first = f.value_and_grad(w, x, b, argnums=(0, 1, 2))  # the serial variant answers; the parallel one compiles in a thread
    (exe, *_), = [v for k, v in f.plan(w, x, b).executables.items() if k[0] == "value_and_grad"]
    (call,) = [c for c in exe.calls if hasattr(c, "chooser")]
    assert call.chooser.choice is None and not call.chooser.timings["parallel_kernel"]
    compiler.wait_for_background_compiles()
    assert "parallel_kernel" not in call.compiled.failed
    runs = [f.value_and_grad(w, x, b, argnums=(0, 1, 2)) for _ in range(8)]  # both variants are timed, then one is kept
    assert len(call.chooser.timings["parallel_kernel"]) == len(call.chooser.timings["serial_kernel"]) == 3
    for value, grads in [first, *runs]:
        assert np.isclose(value, np.sum(e), rtol=1e-6)
        np.testing.assert_allclose(grads[2], e, rtol=1e-5)


def test_float32_sum_is_accurate() -> None:
    x = np.full(1_000_003, 0.1, np.float32)
    total = jg.trace(np.sum)(x)
    assert total.dtype == np.float32
    assert abs(float(total) - 1_000_003 * float(np.float32(0.1))) / 1e5 < 1e-6


def test_buffer_reuse_never_overwrites_arrays_the_user_holds() -> None:
    f = jg.trace(lambda x: np.exp(x) * 2)
    x1, x2 = np.zeros(20_000), np.ones(20_000)
    kept = f(x1)
    kept_view = f(x1)[:10]
    again = f(x2)
    np.testing.assert_array_equal(kept, 2.0)
    np.testing.assert_array_equal(kept_view, 2.0)
    np.testing.assert_allclose(again, 2 * np.e)
    assert not np.shares_memory(kept, again)


def test_buffers_are_recycled_once_released() -> None:
    f = jg.trace(lambda x: np.exp(x) + 1)
    x = np.zeros(20_000)  # pooled: at least 64 KiB
    first = f(x)
    address = first.ctypes.data
    del first
    second = f(x)
    assert second.ctypes.data == address  # the released buffer was reused, not a fresh allocation
    np.testing.assert_array_equal(second, 2.0)


def test_residuals_survive_later_calls() -> None:
    f = jg.trace(lambda x: np.sum(np.exp(x) * np.sin(x)))
    x1, x2 = np.linspace(0, 1, 20_000), np.linspace(1, 2, 20_000)
    _, ctx = f.forward(x1)
    f.forward(x2)
    (g,) = f.backward(ctx, 1.0)
    np.testing.assert_allclose(g, np.exp(x1) * (np.sin(x1) + np.cos(x1)), rtol=1e-12)


def test_variant_chooser_times_both_variants_then_keeps_the_faster() -> None:
    from jitgrad.kernels.cpu.variants import VariantChooser

    assert VariantChooser(10).next() == "serial_kernel"  # small domains never pay for threads
    chooser = VariantChooser(1 << 30)
    seen = []
    while chooser.choice is None:
        variant = chooser.next()
        after_switch = not seen or seen[-1] != variant
        seen.append(variant)
        # a call right after the other variant pays for the switch (a core waking): it is not counted
        chooser.record(variant, 9.0 if after_switch else {"parallel_kernel": 0.5, "serial_kernel": 0.1}[variant])
    trials = VariantChooser.TRIALS
    assert seen == ["parallel_kernel"] * (trials + 1) + ["serial_kernel"] * (trials + 1)  # a streak of each
    assert chooser.timings == {"parallel_kernel": [0.5] * trials, "serial_kernel": [0.1] * trials}
    assert chooser.choice == "serial_kernel"


def _time_until_chosen(chooser, seconds: dict[str, float]) -> list[str]:
    timed = []
    while chooser.choice is None:
        variant = chooser.next()
        timed.append(variant)
        chooser.record(variant, seconds[variant])
    return timed


def test_variant_chooser_re_times_both_variants_when_the_load_changes() -> None:
    from jitgrad.kernels.cpu.variants import VariantChooser

    chooser = VariantChooser(1 << 30)
    _time_until_chosen(chooser, {"parallel_kernel": 0.5, "serial_kernel": 0.1})  # a busy machine
    assert chooser.choice == "serial_kernel"
    every = VariantChooser.RECHECK_EVERY
    assert [chooser.next() for _ in range(every)] == ["serial_kernel"] * every
    first = chooser.next()  # the re-check starts, with a streak of the variant not in use
    assert chooser.choice is None and first == "parallel_kernel"
    chooser.record(first, 0.5)  # right after a serial call: not counted
    timed = [first] + _time_until_chosen(chooser, {"parallel_kernel": 0.05, "serial_kernel": 0.1})  # quiet now
    trials = VariantChooser.RECHECK_TRIALS
    assert timed == ["parallel_kernel"] * (trials + 1) + ["serial_kernel"] * (trials + 1)
    assert chooser.timings["parallel_kernel"] == [0.05] * trials
    assert chooser.choice == "parallel_kernel"


def test_serial_and_parallel_variants_give_identical_numbers() -> None:
    f = jg.trace(loss)
    w, x, b = _wxb(300_000)
    results = [f.value_and_grad(w, x, b, argnums=(0, 1, 2))]  # serial, while the parallel variant compiles
    compiler.wait_for_background_compiles()
    results += [f.value_and_grad(w, x, b, argnums=(0, 1, 2)) for _ in range(6)]  # both variants run while being timed
    for value, grads in results[1:]:
        assert value == results[0][0]
        for g, g0 in zip(grads, results[0][1]):
            np.testing.assert_array_equal(g, g0)


def test_a_loop_holding_the_previous_result_still_recycles_buffers() -> None:
    f = jg.trace(lambda x: np.exp(x) + 1)
    x = np.zeros(20_000)
    addresses = set()
    out = f(x)
    for _ in range(6):
        previous = out
        out = f(x)  # `previous` is alive while this call runs
        assert not np.shares_memory(out, previous)
        addresses.add(out.ctypes.data)
    assert len(addresses) <= 3
    np.testing.assert_array_equal(out, 2.0)


def test_scalar_loss_is_written_by_the_kernel_without_a_host_reshape() -> None:
    f = jg.trace(loss)
    text = f.explain(*_wxb(64))
    call_section = text.split("# call:")[1].split("# call kernel")[0]
    assert "host reshape" not in call_section
    assert "writes ['float32[]']" in call_section


def test_a_second_layout_of_the_same_kernel_gets_its_own_parallel_compile() -> None:
    """Two functions with the same body share one kernel source; called on contiguous and on
    Fortran-ordered inputs (another numba signature), each compiles its parallel variant in the
    background and times it against its serial variant."""
    base = np.random.default_rng(3).random((600, 400)).astype(np.float32)
    for x in (base, base.T.copy().T):
        f = jg.trace(lambda a: np.sum(np.cos(a) * np.arcsinh(a) * 2, axis=1))
        expected = np.sum(np.cos(x.astype(np.float64)) * np.arcsinh(x.astype(np.float64)) * 2, axis=1)
        f(x)
        compiler.wait_for_background_compiles()
        for _ in range(8):
            np.testing.assert_allclose(f(x), expected, rtol=1e-5)
        (exe,) = [v for k, v in f.plan(x).executables.items() if k == "call"]
        (call,) = [c for c in exe.calls if hasattr(c, "chooser")]
        assert call.chooser.choice is not None and len(call.chooser.timings["parallel_kernel"]) == 3


def test_no_cycle_through_a_group_that_spans_back() -> None:
    """A merge whose only path back runs through a step starting after the target group and a group spanning
    back before it (three svds' second derivatives): the cycle search must not stop at that step."""
    w = np.random.default_rng(0).standard_normal((3, 4))

    def three_svds(a):
        return [np.linalg.svd(a, False)[0] ** 2, np.linalg.svd(a, False)[1], np.linalg.svd(a, False)[2] ** 2]

    assert jg.gradgradcheck(three_svds, [w])
