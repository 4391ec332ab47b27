"""jitgrad's matrix products run on one OpenBLAS thread, by a rule on their shape alone
(jitgrad/ops/blas_threads.py): up to SPLIT_FROM multiply-adds the same bits as numpy's
product on one thread, above it the bits of PARTS one-thread products into slices of the output, the same
whether the parts ran side by side or one after the other; whatever numpy's setting, and numpy's setting put
back after them, also when many threads multiply at once."""
import weakref
import threading

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.ops import blas_threads

pytestmark = pytest.mark.skipif(blas_threads._one_thread.found is None, reason="numpy's BLAS is not OpenBLAS")


@pytest.fixture
def two_threads():
    setter, getter = blas_threads._one_thread.found
    before = getter()
    setter(2)
    yield setter, getter
    setter(before)


def products(dtype):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))
            for m, k, n in [(256, 128, 128), (333, 129, 97), (64, 256, 256)]]


def one_after_the_other(a, b):
    """The split product's parts computed in turn on this thread, OpenBLAS at one thread."""
    setter, getter = blas_threads._one_thread.found
    before = getter()
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), a.dtype)
    setter(1)
    for x, y, o in blas_threads._parts(a, b, out):
        np.matmul(x, y, out=o)
    setter(before)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_small_product_has_the_bits_of_one_thread_whatever_numpys_setting(two_threads, dtype) -> None:
    setter, getter = two_threads
    for a, b in products(dtype):
        assert a.size * b.shape[1] <= blas_threads.SPLIT_FROM
        got = blas_threads.matmul(a, b)
        assert getter() == 2
        setter(1)
        want = np.matmul(a, b)
        setter(2)
        assert np.array_equal(got, want)


def operands(dtype):
    """Split products: rows or columns, transposed operands, batch dimensions (broadcast too), odd sizes."""
    rng = np.random.default_rng(1)
    found = []
    for sa, sb, ta, tb in [((128, 256), (256, 1024), 0, 0), ((64, 1024), (1024, 512), 0, 1),
                           ((1024, 64), (64, 1024), 1, 0), ((333, 129), (129, 1257), 1, 1),
                           ((1024, 256), (256, 1024), 0, 0), ((9, 513), (513, 4099), 0, 0),
                           ((8, 128, 256), (8, 256, 512), 0, 0), ((3, 1, 128, 512), (4, 512, 256), 0, 0)]:
        a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
        found.append((a.T.copy().T if ta else a, b.T.copy().T if tb else b))  # .T.copy().T: a transposed view
    return found


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_split_product_has_the_bits_of_its_parts_in_turn_whoever_ran_them(two_threads, dtype) -> None:
    _, getter = two_threads
    for a, b in operands(dtype):
        assert blas_threads.splits(a, b)
        want = one_after_the_other(a, b)
        got = [blas_threads.matmul(a, b) for _ in range(4)]  # the helper, when free, runs the second part
        blas_threads._helper.skip = 2
        got += [blas_threads.matmul(a, b) for _ in range(2)]  # both parts on this thread
        assert all(np.array_equal(g, want) for g in got) and getter() == 2
        tol = 1e-4 if dtype == np.float32 else 1e-12
        exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(want, exact, rtol=tol, atol=tol * 100)


def test_a_batched_product_is_cut_along_its_batch_with_the_whole_products_bits(two_threads) -> None:
    """numpy's matmul makes one gemm call per matrix, the same in any stack, so parts cut along a batch dimension
    have the unsplit product's bits; a batch dimension of odd length below BATCH_CUT_MIN leaves rows cut."""
    setter, _ = two_threads
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((16, 64, 384)).astype(np.float32)  # an attention's q and k: views of one array
    q, k = (qkv[..., i * 128:(i + 1) * 128].reshape(16, 64, 4, 32).transpose(0, 2, 1, 3) for i in range(2))
    cases = [(q, k.transpose(0, 1, 3, 2), 8), (rng.standard_normal((9, 2, 64, 128)).astype(np.float32),
                                               rng.standard_normal((2, 128, 96)).astype(np.float32), 9),
             (rng.standard_normal((9, 128, 256)), rng.standard_normal((256, 128)), 4)]
    for a, b, first_part in cases:
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), a.dtype)
        parts = blas_threads._parts(a, b, out)
        assert blas_threads.splits(a, b)
        assert parts[0][2].shape[:-2] != out.shape[:-2] and parts[0][2].shape[:-2][0] == first_part
        setter(1)
        whole = np.matmul(a, b)
        setter(2)
        assert np.array_equal(one_after_the_other(a, b), whole)
        got = [blas_threads.matmul(a, b) for _ in range(4)]
        assert all(np.array_equal(g, whole) for g in got)
    odd = rng.standard_normal((3, 256, 128)).astype(np.float32), rng.standard_normal((128, 96)).astype(np.float32)
    out = np.empty((3, 256, 96), np.float32)
    assert [p[2].shape for p in blas_threads._parts(*odd, out)] == [(3, 128, 96)] * 2  # rows


def test_a_product_whose_parts_numpy_runs_holding_the_gil_is_not_split(two_threads) -> None:
    """The medium conv net's first-layer weight gradient: parts of 13 x 16 outputs, which numpy computes without
    releasing the GIL, so the helper could not run one beside the caller; it runs whole on one thread."""
    setter, _ = two_threads
    rng = np.random.default_rng(4)
    patches, grads = rng.standard_normal((32768, 27)).astype(np.float32), rng.standard_normal((32768, 16)).astype(
        np.float32)
    assert blas_threads.multiply_adds((27, 32768), (32768, 16)) > blas_threads.SPLIT_FROM
    assert not blas_threads.splits(patches.T, grads)
    got = blas_threads.matmul(patches.T, grads)
    setter(1)
    assert np.array_equal(got, np.matmul(patches.T, grads))
    wide = rng.standard_normal((32768, 46)).astype(np.float32)  # parts of 23 x 22 = 506 output elements
    assert blas_threads.splits(wide.T, wide[:, :22]) and blas_threads.splits(wide[:, :22].T, wide)


def test_numpy_releases_the_gil_around_a_product_of_more_than_the_held_outputs(two_threads) -> None:
    """What the split relies on: a part with more than GIL_HELD_OUTPUT output elements lets other Python threads
    run (here: this one, counting while another thread computes a 23 x 22 product with a long inner dimension).
    OpenBLAS on one thread, as a split product's parts run: on two, its threads could hold both cores for the
    whole product, and this thread counted 0 in a loaded run of the suite. Best of five products: on a machine
    that other processes keep busy this thread may get no core during one of them (9 of 100 beside two spinning
    processes), while a product that kept the GIL would let it count in none."""
    setter, _ = two_threads
    setter(1)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((23, 65536)), rng.standard_normal((65536, 22))
    assert a.shape[0] * b.shape[1] > blas_threads.GIL_HELD_OUTPUT
    out = np.empty((23, 22))

    def count_beside() -> int:
        started, done = threading.Event(), threading.Event()

        def part() -> None:
            started.set()
            np.matmul(a, b, out=out)
            done.set()

        worker = threading.Thread(target=part)
        worker.start()
        started.wait()
        beside = 0
        while not done.is_set():
            beside += 1
        worker.join()
        return beside

    assert max(count_beside() for _ in range(5)) > 1000


def test_a_split_product_writes_through_out_and_not_into_its_own_operands(two_threads) -> None:
    a, b = operands(np.float32)[0]
    out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
    assert blas_threads.matmul(a, b, out=out) is out and np.array_equal(out, one_after_the_other(a, b))
    square = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    want = np.matmul(square, square)
    blas_threads.matmul(square, square, out=square)  # overlaps: numpy's own product, which copies first
    assert np.array_equal(square, want)


def test_without_the_split_a_large_product_keeps_numpys_setting(two_threads, monkeypatch) -> None:
    monkeypatch.setattr(blas_threads, "SPLIT", False)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in [(1024, 256), (256, 1024)])
    assert a.size * b.shape[1] > blas_threads.SMALL_PRODUCT and not blas_threads.splits(a, b)
    assert np.array_equal(blas_threads.matmul(a, b), np.matmul(a, b))


@pytest.mark.parametrize("split", [False, True])
def test_many_threads_multiplying_at_once_leave_the_setting_as_it_was(two_threads, split) -> None:
    _, getter = two_threads
    a, b = operands(np.float32)[0] if split else products(np.float32)[0]
    assert blas_threads.splits(a, b) == split
    want = blas_threads.matmul(a, b)
    barrier, wrong = threading.Barrier(8), []

    def work() -> None:
        barrier.wait()
        for _ in range(50):
            out = np.empty_like(want)
            blas_threads.matmul(a, b, out=out)
            if not np.array_equal(out, want):
                wrong.append(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and getter() == 2 and blas_threads._one_thread.depth == 0


def test_a_traced_product_leaves_numpys_setting_and_matches_numpy(two_threads) -> None:
    _, getter = two_threads
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((128, 128)).astype(np.float32)
    value, grad = jg.trace(lambda w, x: np.sum(np.tanh(x @ w))).value_and_grad(w, x)
    assert getter() == 2
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64.T @ (1 - np.tanh(x64 @ w64) ** 2)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-4)


def test_multiply_adds_count_broadcast_batches() -> None:
    assert blas_threads.multiply_adds((4, 3), (3, 5)) == 60
    assert blas_threads.multiply_adds((4, 3), (7, 3, 5)) == 7 * 60
    assert blas_threads.multiply_adds((2, 1, 4, 3), (6, 3, 5)) == 12 * 60


def test_a_forked_child_splits_products_with_a_helper_of_its_own() -> None:
    import os
    a, b = operands(np.float32)[0]
    want = blas_threads.matmul(a, b)  # the parent's helper thread exists now
    pid = os.fork()
    if pid == 0:
        ok = all(np.array_equal(blas_threads.matmul(a, b), want) for _ in range(3))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_helper_keeps_no_array_alive_after_a_split_product() -> None:
    """The helper thread drops its part's operands and output slice before the caller goes on: an executable's
    buffer pool reuses a buffer only when nobody else holds it (a held one grew the conv net's pool 11 -> 18 MB)."""
    a, b = np.ones((600, 300), np.float32), np.ones((300, 600), np.float32)  # 108M multiply-adds: split
    assert blas_threads.splits(a, b) or blas_threads._one_thread.found is None
    refs = []
    for _ in range(8):
        out = blas_threads.matmul(a, b)
        refs.append(weakref.ref(out))
        del out
    assert all(r() is None for r in refs)
