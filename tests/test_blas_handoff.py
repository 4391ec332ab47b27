"""The GIL-free handover of a split product's second part (jitgrad/ops/blas_handoff.py): each part is the gemm
call numpy's matmul makes for it, so a split product has the bits of np.matmul's parts in turn whichever thread
ran them; a part numpy would not give to gemm keeps the Python handover; the helper stops polling once idle; a
process that splits few products never builds the handoff, nor one with JITGRAD_BLAS_HANDOFF=0."""
import contextlib
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jitgrad.ops import blas_threads
from test_blas_threads import one_after_the_other  # the split product's parts by np.matmul, in turn

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(blas_threads._one_thread.found is None, reason="numpy's BLAS is not OpenBLAS")


@pytest.fixture(scope="module")
def handoff():
    from jitgrad.ops import blas_handoff
    if blas_handoff._gemm_pointers(blas_threads._one_thread.library) is None:
        pytest.skip("numpy's OpenBLAS exports no ILP64 cblas gemm")
    helper = blas_threads._helper
    a, b = np.ones((256, 128), np.float32), np.ones((128, 512), np.float32)
    helper.skip = 0
    blas_threads.matmul(a, b)  # starts the helper thread
    if helper.handoff is None:
        helper._build_handoff()
    return helper.handoff


def until_handed(handoff, product, seconds=20.0) -> bool:
    """Runs `product` until the helper has computed a part of it (on a loaded machine it may be late at first)."""
    handed, deadline = handoff.handed, time.monotonic() + seconds
    while handoff.handed == handed and time.monotonic() < deadline:
        product()
    return handoff.handed > handed


@contextlib.contextmanager
def one_openblas_thread():
    setter, getter = blas_threads._one_thread.found
    before = getter()
    setter(1)
    try:
        yield
    finally:
        setter(before)


def layouts(dtype):
    """2-D operands numpy gives to gemm: C and Fortran order, slices of wider arrays (a leading dimension above
    the row), rows and columns split, odd sizes."""
    rng = np.random.default_rng(7)
    found = []
    for (m, k, n), ta, tb in [((256, 128, 512), 0, 0), ((64, 256, 1024), 1, 0), ((1024, 64, 96), 0, 1),
                              ((333, 129, 257), 1, 1), ((9, 513, 4099), 0, 0)]:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        found.append((np.asfortranarray(a) if ta else a, np.asfortranarray(b) if tb else b))
    wide = rng.standard_normal((300, 700)).astype(dtype)
    found.append((wide[:, :200], wide[:200, 100:650]))  # leading dimensions 700, views of one array
    found.append((wide[:200, :300].T, wide[:200, 100:]))  # a transposed view with leading dimension 700
    return found


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_part_has_the_bits_of_numpys_product_whoever_computes_it(handoff, dtype) -> None:
    for a, b in layouts(dtype):
        assert blas_threads.splits(a, b)
        out = np.empty((a.shape[0], b.shape[1]), dtype)
        gemms = [handoff.describe(*part) for part in blas_threads._parts(a, b, out)]
        assert all(gemms)
        want = one_after_the_other(a, b)
        got = []

        def product():
            out[...] = np.nan
            with one_openblas_thread():  # as blas_threads.matmul runs them: OpenBLAS's bits depend on its threads
                handoff.split(*gemms)
            got.append(np.array_equal(out, want))

        product()  # the helper asleep: most likely the caller computes both parts
        assert until_handed(handoff, product)  # the helper computed the second part
        assert all(got)
        blas_threads._helper.skip = 0
        assert np.array_equal(blas_threads.matmul(a, b), want)


def test_what_numpy_does_not_give_to_gemm_is_not_described(handoff) -> None:
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    out = np.zeros((64, 48), np.float32)
    assert handoff.describe(a, b, out) is not None
    assert handoff.describe(a[:, ::2], b[::2], out) is None  # no unit stride
    assert handoff.describe(a[:1], b, out[:1]) is None  # a row: numpy's gemv
    assert handoff.describe(a, b[:, :1], out[:, :1]) is None  # a column: gemv
    assert handoff.describe(a, b.astype(np.float64), out) is None  # mixed dtypes
    assert handoff.describe(a.astype(np.int64), b.astype(np.int64), out.astype(np.int64)) is None
    square = rng.standard_normal((48, 48)).astype(np.float32)
    assert handoff.describe(square, square.T, np.empty((48, 48), np.float32)) is None  # numpy's syrk
    other = square.copy()
    assert handoff.describe(square, other.T, np.empty((48, 48), np.float32)) is not None  # two arrays: gemm
    stack = rng.standard_normal((4, 48, 48)).astype(np.float32)
    assert handoff.describe(stack, stack.transpose(0, 2, 1), np.empty((4, 48, 48), np.float32)) is None
    assert handoff.describe(stack[1:], stack[:3].transpose(0, 2, 1), np.empty((3, 48, 48), np.float32)) is not None
    assert handoff.describe(a, b, np.empty((48, 64), np.float32).T) is None  # output not in rows
    assert handoff.describe(a[None], b[None], out[None]) is not None  # a stack of one
    deep = rng.standard_normal((2, 3, 5, 64, 32)).astype(np.float32)
    assert handoff.describe(deep, b, np.empty((2, 3, 5, 64, 48), np.float32)) is not None  # one level, merged
    mixed = deep.transpose(2, 1, 0, 3, 4)  # no two batch dimensions step evenly
    assert handoff.describe(mixed, b, np.empty((5, 3, 2, 64, 48), np.float32)) is None  # three levels
    assert handoff.describe(mixed[:, 0], b, np.empty((5, 2, 64, 48), np.float32)) is not None  # two


def stacks(dtype):
    """Batched products cut along their batch: views of one array (an attention's q and k), a broadcast operand, two
    levels of batch dimensions, a level of odd length."""
    rng = np.random.default_rng(10)
    qkv = rng.standard_normal((16, 64, 192)).astype(dtype)
    q, k = (qkv[..., i * 64:(i + 1) * 64].reshape(16, 64, 4, 16).transpose(0, 2, 1, 3) for i in range(2))
    return [(q, k.transpose(0, 1, 3, 2)), (rng.standard_normal((16, 4, 64, 64)).astype(dtype), q),
            (rng.standard_normal((9, 2, 64, 128)).astype(dtype), rng.standard_normal((2, 128, 96)).astype(dtype)),
            (rng.standard_normal((9, 128, 64)).astype(dtype), rng.standard_normal((64, 256)).astype(dtype))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_batched_part_has_the_bits_of_numpys_product_whoever_computes_it(handoff, dtype) -> None:
    for a, b in stacks(dtype):
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), dtype)
        calls = handoff.calls(a, b, out, blas_threads._parts)
        assert calls == [handoff.describe(*part) for part in blas_threads._parts(a, b, out)]
        with one_openblas_thread():
            want = np.matmul(a, b)  # a batched product's parts are cut along its batch: the whole product's bits
        got = []

        def product():
            out[...] = np.nan
            with one_openblas_thread():
                handoff.split(*calls)
            got.append(np.array_equal(out, want))

        assert until_handed(handoff, product)
        assert all(got)


def test_the_parts_calls_are_derived_once_per_layout_and_moved_to_each_products_addresses(handoff) -> None:
    rng = np.random.default_rng(11)
    for a, b in layouts(np.float32)[:3] + stacks(np.float32)[:2]:
        for _ in range(2):  # new arrays of the same layout: the calls derived for the first, at these addresses
            a2, b2 = np.empty_like(a), np.empty_like(b)
            a2[...], b2[...] = a, b
            x, y = (a2 if a.flags.c_contiguous else a), b2 if b.flags.c_contiguous else b
            out = np.empty(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1]), np.float32)
            assert handoff.calls(x, y, out, blas_threads._parts) == [
                handoff.describe(*part) for part in blas_threads._parts(x, y, out)]
    square = rng.standard_normal((4, 256, 256)).astype(np.float32)
    out = np.empty((4, 256, 256), np.float32)
    assert handoff.calls(square, square.copy().transpose(0, 2, 1), out, blas_threads._parts) is not None
    assert handoff.calls(square, square.transpose(0, 2, 1), out, blas_threads._parts) is None  # one array: syrk


def test_a_part_for_the_python_handover_interrupts_the_helpers_polling(handoff) -> None:
    rng = np.random.default_rng(9)
    flat = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((128, 512)).astype(np.float32)
    strided = rng.standard_normal((256, 256)).astype(np.float32)[:, ::2], flat[1]  # no unit stride: not gemm's
    assert blas_threads.splits(*strided) and handoff.describe(*strided, np.empty((256, 512), np.float32)) is None
    with one_openblas_thread():
        want_flat = np.matmul(*flat)
    want_strided = one_after_the_other(*strided)
    results = []

    def products():
        blas_threads._helper.skip = 0
        results.append(np.array_equal(blas_threads.matmul(*flat), want_flat))
        got = blas_threads.matmul(*strided)  # right after: the helper is polling
        results.append(np.array_equal(got, want_strided))

    assert until_handed(handoff, products)
    for _ in range(5):
        products()
    assert all(results)


def _ticks(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
def test_the_helper_stops_polling_once_idle(handoff) -> None:
    from jitgrad.ops import blas_handoff
    a, b = layouts(np.float32)[0]
    blas_threads._helper.skip = 0
    for _ in range(3):
        blas_threads.matmul(a, b)
    helper = blas_threads._helper.thread
    time.sleep(0.05)  # many times SPIN_NS
    assert handoff.state[blas_handoff.SLEEPING] == 1
    start = _ticks(helper.native_id)
    time.sleep(0.3)
    assert _ticks(helper.native_id) - start <= 2  # clock ticks of 10 ms: asleep, not polling


def test_threads_splitting_at_once_get_numpys_bits(handoff) -> None:
    """One product at a time uses the helper; the others run their parts in turn, with the same bits."""
    cases = layouts(np.float32)[:3]
    wants = [one_after_the_other(a, b) for a, b in cases]
    failures = []

    def work():
        for _ in range(20):
            for (a, b), want in zip(cases, wants):
                if not np.array_equal(blas_threads.matmul(a, b), want):
                    failures.append((a.shape, b.shape))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


PROBE = """
import sys
import numpy as np
import jitgrad  # its CPU executor makes the background-compile queue build the handoff
from jitgrad.ops import blas_threads
from jitgrad.kernels.build import compiler
a, b = np.ones((256, 128), np.float32), np.ones((128, 512), np.float32)
for _ in range(int(sys.argv[1])):
    blas_threads.matmul(a, b)
compiler.wait_for_background_compiles()
print(blas_threads._helper.handoff is not None, "jitgrad.ops.blas_handoff" in sys.modules)
"""


@pytest.mark.parametrize("products, env, built, imported", [
    (5, {}, False, False),  # a short script never compiles it
    (blas_threads.HANDOFF_AFTER + 8, {}, True, True),
    (blas_threads.HANDOFF_AFTER + 8, {"JITGRAD_BLAS_HANDOFF": "0"}, False, False),
])
def test_the_handoff_is_built_once_a_process_split_enough_products(handoff, products, env, built, imported) -> None:
    environ = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", PROBE, str(products)], env=environ, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(built), str(imported)]


def test_a_child_forked_while_the_helper_polls_has_a_helper_of_its_own(handoff) -> None:
    a, b = layouts(np.float32)[0]
    want = one_after_the_other(a, b)
    blas_threads._helper.skip = 0
    blas_threads.matmul(a, b)  # the parent's helper polls now
    pid = os.fork()
    if pid == 0:
        ok = all(np.array_equal(blas_threads.matmul(a, b), want) for _ in range(blas_threads.HANDOFF_AFTER + 8))
        os._exit(0 if ok and blas_threads._helper is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert np.array_equal(blas_threads.matmul(a, b), want)
