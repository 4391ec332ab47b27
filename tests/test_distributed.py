"""jg.distributed on a real LocalCluster of two worker processes: data-parallel gradients equal the
single-process ones for an MLP (a sum) and softmax cross-entropy (a mean) over uneven shards, plans
compile once per worker, SGD over the cluster follows the local SGD, a worker killed mid-step does not
change the answer, and a worker without jitgrad is named in a jitgrad error."""
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("dask.distributed")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
from dask.distributed import Client, LocalCluster, get_task_stream  # noqa: E402
from dask.utils import key_split  # noqa: E402

import jitgrad as jg  # noqa: E402
from jitgrad import distributed as jgd  # noqa: E402

FEATURES, HIDDEN, CLASSES = 12, 8, 5
REL_TOL = 1e-6


@jg.trace
def mlp_loss(weight, bias, x):
    """W2 of bench/workloads.py: a sum over the batch."""
    return np.sum(np.tanh(x @ weight + bias) ** 2)


def cross_entropy(weight, x, labels):
    """W3 of bench/workloads.py on logits x @ weight: a mean over the batch."""
    logits = x @ weight
    return np.mean(jg.logsumexp(logits, 1) - logits[np.arange(logits.shape[0]), labels])


def slow_rows(rows: np.ndarray, seconds: float) -> np.ndarray:
    """A batch shard that takes `seconds` to load, so a step is still running when a worker is killed."""
    time.sleep(seconds)
    return rows


def worker_plan_stats(token: str) -> dict:
    """Run on a worker: plan cache statistics of its Traced for one distributed function."""
    traced = jgd._WORKER_TRACED.get(token)
    return traced.cache_info() if traced is not None else {}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jitgrad-cache")
    saved_env = dict(os.environ)  # Dask's nannies write OMP_NUM_THREADS=1 etc. into this process's environment
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env={"JITGRAD_CACHE_DIR": str(cache)}) as cluster, Client(cluster) as c:
        yield c
    os.environ.clear()
    os.environ.update(saved_env)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(18)
    return {"weight": rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
            "bias": rng.standard_normal(HIDDEN) * 0.1,
            "x": rng.standard_normal((203, FEATURES)),
            "classifier": rng.standard_normal((FEATURES, CLASSES)),
            "labels": rng.integers(0, CLASSES, 203)}


def assert_matches(got, want) -> None:
    """Value and every gradient within REL_TOL (normwise) of the single-process result."""
    (value, grads), (ref_value, ref_grads) = got, want
    assert abs(value - ref_value) <= REL_TOL * abs(ref_value)
    grads = grads if isinstance(grads, tuple) else (grads,)
    ref_grads = ref_grads if isinstance(ref_grads, tuple) else (ref_grads,)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert np.max(np.abs(g - r)) <= REL_TOL * np.max(np.abs(r))


def wait_for_workers(client: Client, n: int = 2) -> None:
    client.wait_for_workers(n, timeout=60)


def test_lazy_attribute():
    assert jg.distributed is jgd


def test_mlp_sum_over_uneven_numpy_shards(client, data):
    step = jgd.value_and_grad(mlp_loss, client, argnums=(0, 1), batch_argnums=2, reduce="sum", shards=3)
    want = jg.value_and_grad(mlp_loss, argnums=(0, 1))(data["weight"], data["bias"], data["x"])
    with get_task_stream(client) as stream:
        assert_matches(step(data["weight"], data["bias"], data["x"]), want)  # shards of 68, 68 and 67 rows
    prefixes = {key_split(t["key"]) for t in stream.data}
    assert prefixes == {"mlp_loss-params", "mlp_loss-batch", "mlp_loss-shard-inputs", "mlp_loss-value-and-grad-part",
                        "mlp_loss-value-and-grad-aggregate", "mlp_loss-check-reduce"}


def test_plans_compile_once_per_worker(client, data):
    def local_mlp_loss(weight, bias, x):  # a local function: it travels by value (cloudpickle)
        return np.sum(np.tanh(x @ weight + bias) ** 2)

    step = jgd.value_and_grad(local_mlp_loss, client, argnums=(0, 1), batch_argnums=2, reduce="sum")
    x = jgd.shard(client, data["x"][:202], shards=2)[0]  # two shards of 101 rows: one signature
    first = step(data["weight"], data["bias"], x)
    for _ in range(3):
        assert_matches(step(data["weight"], data["bias"], x), first)
    stats = [s for s in client.run(worker_plan_stats, step._token).values() if s]
    calls = sum(s["hits"] + s["misses"] for s in stats)
    assert calls == 4 * 2 + 2  # 4 steps of 2 shards, and the first step's check of `reduce` (2 calls)
    assert sum(s["misses"] for s in stats) <= 2 * 1 + 2  # per worker one shard plan; the check's two plans


def test_cross_entropy_mean_over_placed_shards(client, data):
    step = jgd.value_and_grad(cross_entropy, client, argnums=0, batch_argnums=(1, 2))
    want = jg.value_and_grad(cross_entropy, argnums=0)(data["classifier"], data["x"], data["labels"])
    x, labels = jgd.shard(client, data["x"], data["labels"], shards=3)
    assert x.chunks[0] == (68, 68, 67)
    for _ in range(2):  # placed once, used by every step
        assert_matches(step(data["classifier"], x, labels), want)


def test_cross_entropy_from_futures_and_dask_arrays(client, data):
    step = jgd.value_and_grad(cross_entropy, client, argnums=0, batch_argnums=(1, 2))
    want = jg.value_and_grad(cross_entropy, argnums=0)(data["classifier"], data["x"], data["labels"])
    cuts = [0, 100, 150, 203]
    xs = client.scatter([data["x"][a:b] for a, b in zip(cuts, cuts[1:])])
    ys = client.scatter([data["labels"][a:b] for a, b in zip(cuts, cuts[1:])])
    assert_matches(step(data["classifier"], xs, ys), want)
    x = da.from_array(data["x"], chunks=(90, FEATURES))
    assert_matches(step(data["classifier"], x, data["labels"]), want)  # numpy labels follow x's chunks


def test_wrong_reduce_is_refused(client, data):
    step = jgd.value_and_grad(mlp_loss, client, argnums=(0, 1), batch_argnums=2)  # mlp_loss is a sum
    with pytest.raises(jg.InputError, match="reduce='sum'"):
        step(data["weight"], data["bias"], data["x"])


def test_argument_mistakes(client, data):
    with pytest.raises(jg.InputError, match="reduce must be"):
        jgd.value_and_grad(mlp_loss, client, batch_argnums=2, reduce="max")
    step = jgd.value_and_grad(mlp_loss, client, argnums=(0, 2), batch_argnums=2, reduce="sum")
    with pytest.raises(jg.InputError, match="includes batch argument"):
        step(data["weight"], data["bias"], data["x"])
    step = jgd.value_and_grad(cross_entropy, client, batch_argnums=(1, 2))
    with pytest.raises(jg.InputError, match="rows"):
        step(data["classifier"], data["x"], data["labels"][:-1])


def test_fit_follows_local_sgd(client, data):
    x, labels = data["x"], data["labels"]
    batches = [(x[:120], labels[:120]), (x[120:], labels[120:])]
    trained, losses = jgd.fit(cross_entropy, client, [data["classifier"]], batches, lr=0.5, epochs=2)
    local = jg.value_and_grad(cross_entropy, argnums=(0,))
    weight = data["classifier"].copy()
    for _ in range(2):
        for xb, yb in batches:
            value, (grad,) = local(weight, xb, yb)
            assert abs(losses.pop(0) - value) <= REL_TOL * abs(value)
            weight -= 0.5 * grad
    assert np.max(np.abs(trained[0] - weight)) <= REL_TOL * np.max(np.abs(weight))
    assert not np.array_equal(trained[0], data["classifier"])  # the caller's array is left alone


def test_worker_killed_mid_step(client, data):
    wait_for_workers(client)
    step = jgd.value_and_grad(cross_entropy, client, argnums=0, batch_argnums=(1, 2))
    want = jg.value_and_grad(cross_entropy, argnums=0)(data["classifier"], data["x"], data["labels"])
    cuts = [0, 70, 140, 203]
    loads = [dask.delayed(slow_rows)(data["x"][a:b], 1.5, dask_key_name=f"slow-rows-{a}") for a, b in
             zip(cuts, cuts[1:])]
    x = da.concatenate([da.from_delayed(part, (b - a, FEATURES), np.float64)
                        for part, a, b in zip(loads, cuts, cuts[1:])])
    pids = client.run(os.getpid)
    result = {}

    def run_step() -> None:
        try:
            result["out"] = step(data["classifier"], x, data["labels"])
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    runner = threading.Thread(target=run_step)
    runner.start()
    victim = None
    deadline = time.monotonic() + 30
    while victim is None and time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items() if any("slow-rows" in str(k) for k in keys)]
        victim = busy[0] if busy else None
        time.sleep(0.05)
    assert victim is not None, "the step never started loading its shards"
    os.kill(pids[victim], signal.SIGKILL)
    runner.join(timeout=120)
    assert "out" in result, result.get("error", "the step did not finish")
    assert_matches(result["out"], want)
    wait_for_workers(client)


def test_lost_scattered_shard_is_a_jitgrad_error(client, data):
    wait_for_workers(client)
    step = jgd.value_and_grad(cross_entropy, client, argnums=0, batch_argnums=(1, 2))
    cuts = [0, 100, 203]
    xs = client.scatter([data["x"][a:b] for a, b in zip(cuts, cuts[1:])])
    ys = client.scatter([data["labels"][a:b] for a, b in zip(cuts, cuts[1:])])
    holder = next(iter(client.who_has(xs)[xs[0].key]))
    os.kill(client.run(os.getpid)[holder], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while xs[0].status != "cancelled" and time.monotonic() < deadline:  # the scheduler has seen the loss
        time.sleep(0.05)
    with pytest.raises(jgd.DistributedError, match="lost with a worker"):
        step(data["classifier"], xs, ys)
    wait_for_workers(client)


def test_function_the_workers_cannot_load_is_named(client, tmp_path, monkeypatch):
    (tmp_path / "unshipped_loss.py").write_text("import numpy as np\n\n"
                                                "def loss(w, x):\n    return np.sum(x @ w)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # this process only: the workers started without it
    try:
        import unshipped_loss
        with pytest.raises(jgd.DistributedError, match="No module named 'unshipped_loss'") as info:
            jgd.value_and_grad(unshipped_loss.loss, client, batch_argnums=1, reduce="sum")
    finally:
        sys.modules.pop("unshipped_loss", None)
    assert all(worker in str(info.value) for worker in client.scheduler_info()["workers"])


def test_worker_without_jitgrad_is_named(tmp_path):
    saved_env = dict(os.environ)
    blocker = "import sys; sys.modules['jitgrad'] = None  # this worker cannot import jitgrad"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      preload=[blocker], env={"JITGRAD_CACHE_DIR": str(tmp_path)}) as cluster, \
            Client(cluster) as c:
        [worker] = c.scheduler_info()["workers"]
        with pytest.raises(jgd.DistributedError, match="cannot import jitgrad") as info:
            jgd.value_and_grad(mlp_loss, c, argnums=(0, 1), batch_argnums=2, reduce="sum")
        assert worker in str(info.value)
    os.environ.clear()
    os.environ.update(saved_env)
