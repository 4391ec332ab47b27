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
    assert handoff.describe(a[None], b[None], out[None]) is None  # batched
    square = rng.standard_normal((48, 48)).astype(np.float32)
    assert handoff.describe(square, square.T, np.empty((48, 48), np.float32)) is None  # numpy's syrk
    assert handoff.describe(a, b, np.empty((48, 64), np.float32).T) is None  # output not in rows


def test_a_part_for_the_python_handover_interrupts_the_helpers_polling(handoff) -> None:
    rng = np.random.default_rng(9)
    flat = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((128, 512)).astype(np.float32)
    batched = rng.standard_normal((8, 128, 256)).astype(np.float32), rng.standard_normal((8, 256, 512)).astype(
        np.float32)
    with one_openblas_thread():
        want_flat, want_batched = np.matmul(*flat), [np.matmul(*p[:2]) for p in blas_threads._parts(
            *batched, np.empty((8, 128, 512), np.float32))]
    results = []

    def products():
        blas_threads._helper.skip = 0
        results.append(np.allclose(blas_threads.matmul(*flat), want_flat, rtol=1e-5, atol=1e-4))
        got = blas_threads.matmul(*batched)  # right after: the helper is polling
        results.append(np.array_equal(got, np.concatenate(want_batched, axis=-1)))  # parts are column slices

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
