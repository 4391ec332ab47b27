"""Data-parallel value-and-grad and SGD training over a Dask cluster (`jg.distributed`, imported on first use).

`value_and_grad(fn, client, batch_argnums=...)` returns a function called like `jg.value_and_grad(fn)`:
the batch arguments are split along axis 0 into shards, every shard runs jitgrad's compiled
value-and-grad of `fn` on the worker that holds it, and the per-shard losses and gradients are
combined by Dask's tree reduction (`dask.bag.Bag.reduction`), weighted by shard rows. Dask does all
the scheduling, data transport, reduction placement and recovery from lost workers; this module
only builds the task graph. Each worker process keeps one `Traced` per distributed function, so its
plans are traced and compiled once (kernels from jitgrad's disk cache) and every later step reuses them.
"""
from __future__ import annotations

import functools
import pickle
import pkgutil
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, NamedTuple, Sequence

import numpy as np

try:
    import dask.array as da
    import dask.bag as db
    from dask.distributed import Client, Future, futures_of
    from distributed.client import FutureCancelledError
    from distributed.protocol import pickle as dask_pickle
except ImportError as exc:  # Dask is an optional dependency
    raise ImportError("jg.distributed needs Dask; install it with `python -m pip install 'jitgrad[distributed]'`") \
        from exc

from jitgrad import __version__
from jitgrad.front.api import Traced
from jitgrad.errors import InputError, JitgradError

Reduce = Literal["mean", "sum"]
_CHECK_ROWS = 16  # rows of the first shard that the first call uses to check `reduce` against fn
_CHECK_RTOL = 1e-4  # a wrong `reduce` is off by a factor of 2 on that check; rounding is far below this


class DistributedError(JitgradError, RuntimeError):
    """The cluster cannot run a step: the client is closed, a worker lacks jitgrad, or data a step needs was lost
    with a worker."""


class Partial(NamedTuple):
    """What one shard (or one subtree of the reduction) contributes: its rows, loss and gradients."""

    rows: int
    value: Any
    grads: Any


@dataclass(frozen=True)
class _Spec:
    """What a worker needs to run one shard: the function, which arguments are batches, what to differentiate."""

    token: str
    fn: Callable[..., Any]
    argnums: int | tuple[int, ...]
    batch_positions: tuple[int, ...]

    def __dask_tokenize__(self) -> Any:
        return self.token, self.argnums, self.batch_positions

    def arguments(self, params: Sequence[Any], batch: Sequence[Any]) -> list[Any]:
        """fn's positional arguments: the batch shards at their positions, the parameters around them."""
        args: list[Any] = []
        params_left, batch_left = iter(params), iter(batch)
        for i in range(len(params) + len(batch)):
            args.append(next(batch_left) if i in self.batch_positions else next(params_left))
        return args


_WORKER_TRACED: dict[str, Traced] = {}  # per worker process: one Traced (and so one plan cache) per spec token


def _traced(spec: _Spec) -> Traced:
    """The worker's Traced for this distributed function, made on its first shard."""
    found = _WORKER_TRACED.get(spec.token)
    if found is None:
        found = _WORKER_TRACED.setdefault(spec.token, spec.fn if isinstance(spec.fn, Traced) else Traced(spec.fn))
    return found


def _shard_rows(index: int, batch: Sequence[Any]) -> int:
    """The shard's row count; every batch argument of a shard must have the same, and at least one."""
    rows = {int(np.shape(b)[0]) if np.ndim(b) else -1 for b in batch}
    if len(rows) != 1 or min(rows) < 1:
        raise InputError(f"shard {index}: the batch arguments have {sorted(rows)} rows (-1: a scalar); every shard "
                         f"needs the same number (at least 1) of rows in each batch argument")
    return rows.pop()


def _shard_value_and_grad(spec: _Spec, inputs: Sequence[Any]) -> Partial:
    """Run on a worker: the compiled value-and-grad of fn on one shard."""
    index, params, *batch = inputs
    rows = _shard_rows(index, batch)
    value, grads = _traced(spec).value_and_grad(*spec.arguments(params, batch), argnums=spec.argnums)
    return Partial(rows, value, grads)


def _weighted_sum(items: Sequence[Any], weights: Sequence[float]) -> Any:
    """sum(w * x) over matching gradient structures (an array, None, or a tuple of those)."""
    if items[0] is None:
        return None
    if isinstance(items[0], tuple):
        return tuple(_weighted_sum(column, weights) for column in zip(*items))
    total = items[0] * weights[0]
    for item, weight in zip(items[1:], weights[1:]):
        total = total + item * weight
    return total


def _combine(reduce: Reduce, partials: Iterable[Partial]) -> Partial:
    """One node of the tree reduction: a rows-weighted mean, or a sum, of its children."""
    parts = list(partials)
    rows = sum(p.rows for p in parts)
    weights = [p.rows / rows for p in parts] if reduce == "mean" else [1] * len(parts)
    return Partial(rows, _weighted_sum([p.value for p in parts], weights),
                   _weighted_sum([p.grads for p in parts], weights))


def _check_reduce(spec: _Spec, reduce: Reduce, params: Sequence[Any], *batch: Any) -> None:
    """Run on a worker once: fn on some rows and on those rows twice over must agree with `reduce`."""
    rows = [np.asarray(b)[:_CHECK_ROWS] for b in batch]
    traced = _traced(spec)
    once = float(traced.value_and_grad(*spec.arguments(params, rows), argnums=spec.argnums)[0])
    twice = float(traced.value_and_grad(*spec.arguments(params, [np.concatenate([r, r]) for r in rows]),
                                        argnums=spec.argnums)[0])
    agrees = {"mean": _close(twice, once), "sum": _close(twice, 2 * once)}
    if not agrees[reduce]:
        other = "sum" if reduce == "mean" else "mean"
        fix = (f"pass reduce={other!r}" if agrees[other] else
               "write fn as a mean (or sum) over rows plus terms that do not depend on the batch")
        raise InputError(f"{traced.name}: reduce={reduce!r}, but on the same rows given twice it returns {twice!r} "
                         f"against {once!r} for them once, so shard losses cannot be combined as a {reduce}; {fix}")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _CHECK_RTOL * max(abs(a), abs(b))


def _require_open(client: Client, name: str) -> None:
    """The client must still be connected (a closed one has no scheduler, and Dask fails on it with an
    AttributeError); say so and what to do."""
    if client.status in ("closing", "closed"):
        raise DistributedError(f"{name}: the Dask client is {client.status}; create a new one (Client(cluster) or "
                               f"Client(scheduler_address)) and pass that, with a new jg.distributed.value_and_grad "
                               f"for a step made with the closed one")


def _require_jitgrad(client: Client) -> None:
    """Every worker must import the same jitgrad as this process; name the workers that do not."""
    found = client.run(pkgutil.resolve_name, "jitgrad:__version__", on_error="return")
    bad = {worker: v for worker, v in found.items() if v != __version__}
    if bad:
        lines = [f"{worker}: " + (f"cannot import jitgrad ({type(v).__name__}: {v})" if isinstance(v, BaseException)
                                  else f"has jitgrad {v}") for worker, v in sorted(bad.items())]
        raise DistributedError(f"jitgrad {__version__} must be installed on every Dask worker, but\n  " +
                               "\n  ".join(lines) + "\ninstall it in the workers' environment (e.g. "
                               "`pip install jitgrad[distributed]` in the image or job script) and restart them")


def _require_loadable(client: Client, fn: Callable[..., Any], name: str) -> None:
    """Every worker must be able to unpickle fn as Dask sends it; name the workers that cannot (and why)."""
    found = client.run(pickle.loads, dask_pickle.dumps(fn), on_error="return")
    bad = {worker: v for worker, v in found.items() if isinstance(v, BaseException)}
    if bad:
        lines = [f"{worker}: {type(v).__name__}: {v}" for worker, v in sorted(bad.items())]
        raise DistributedError(f"{name}: the Dask workers cannot load the function (it travels by reference to its "
                               f"module, unless it is defined in __main__ or locally):\n  " + "\n  ".join(lines) +
                               "\ninstall its module on the workers (or `client.upload_file` it), or define it in "
                               "the script that calls jg.distributed")


def _positions(spec: int | Sequence[int], nargs: int, what: str, fname: str) -> tuple[int, ...]:
    """argnums-like positions made non-negative, checked against the call's argument count."""
    items = [spec] if isinstance(spec, int) else list(spec)
    for a in items:
        if not -nargs <= int(a) < nargs:
            raise InputError(f"{fname}: {what} {a} is out of range for {nargs} argument(s)")
    return tuple(int(a) % nargs for a in items)


def _row_chunks(rows: int, shards: int) -> tuple[int, ...]:
    """Row counts of `shards` nearly equal shards (np.array_split's), none empty."""
    shards = max(1, min(shards, rows))
    return tuple(rows // shards + (1 if k < rows % shards else 0) for k in range(shards))


def _as_dask(x: Any, rows: tuple[int, ...], name: str) -> da.Array:
    """A batch argument as a dask array with these row chunks and one chunk along every other axis."""
    if isinstance(x, da.Array):
        return x.rechunk((rows,) + tuple((d,) for d in x.shape[1:]))
    arr = np.asarray(x)
    return da.from_array(arr, chunks=(rows,) + tuple((d,) for d in arr.shape[1:]), name=name)


def shard(client: Client, *arrays: Any, shards: int | None = None) -> tuple[da.Array, ...]:
    """Place batch arrays on the workers once, split alike along axis 0 (default: one shard per worker thread),
    as persisted dask arrays: pass them to a distributed value_and_grad every step; Dask recomputes a lost shard."""
    _require_open(client, "shard")
    lengths = {int(np.shape(a)[0]) for a in arrays}
    if len(lengths) != 1:
        raise InputError(f"shard: the arrays have {sorted(lengths)} rows; batch arrays must have the same number")
    rows = _row_chunks(lengths.pop(), shards or sum(client.nthreads().values()))
    token = uuid.uuid4().hex
    return tuple(client.persist([_as_dask(a, rows, f"batch-{i}-{token}") for i, a in enumerate(arrays)]))


class DistributedValueAndGrad:
    """`jg.value_and_grad(fn, argnums)` computed data-parallel over a Dask cluster; see `value_and_grad`."""

    def __init__(self, fn: Callable[..., Any], client: Client, argnums: int | Sequence[int],
                 batch_argnums: int | Sequence[int], reduce: Reduce, shards: int | None, retries: int):
        if reduce not in ("mean", "sum"):
            raise InputError(f"reduce must be 'mean' or 'sum', got {reduce!r}: it says how fn combines its rows")
        self.fn, self.client, self.reduce, self.shards, self.retries = fn, client, reduce, shards, retries
        self.argnums = argnums if isinstance(argnums, int) else tuple(argnums)
        self.batch_argnums = batch_argnums
        self.name = getattr(fn, "__name__", "fn")
        self.__name__ = f"distributed_value_and_grad_{self.name}"
        self._token = uuid.uuid4().hex
        self._checked: set[tuple[int, ...]] = set()
        _require_open(client, self.name)
        _require_jitgrad(client)
        _require_loadable(client, fn, self.name)

    def __repr__(self) -> str:
        return f"<jitgrad.distributed.value_and_grad {self.name} on {self.client!r}>"

    def __call__(self, *args: Any) -> tuple[Any, Any]:
        _require_open(self.client, self.name)
        batch_positions = _positions(self.batch_argnums, len(args), "batch_argnums", self.name)
        wanted = _positions(self.argnums, len(args), "argnums", self.name)
        if set(wanted) & set(batch_positions):
            raise InputError(f"{self.name}: argnums {self.argnums} includes batch argument(s) "
                             f"{sorted(set(wanted) & set(batch_positions))}; gradients are reduced over the batch, so "
                             f"differentiate only the parameters (use jg.value_and_grad for gradients of batch rows)")
        spec = _Spec(self._token, self.fn, self.argnums, batch_positions)
        shards = self._shards([args[i] for i in batch_positions])
        params = tuple(a for i, a in enumerate(args) if i not in batch_positions)
        step = uuid.uuid4().hex
        futures = [self._reduction(spec, params, shards, step)]
        if batch_positions not in self._checked:
            futures.append(self.client.submit(_check_reduce, spec, self.reduce, params, *shards[0],
                                              key=f"{self.name}-check-reduce-{step}", retries=self.retries))
        total = self._gather(futures)[0]
        self._checked.add(batch_positions)
        return total.value, total.grads

    def _reduction(self, spec: _Spec, params: tuple[Any, ...], shards: list[list[Future]], step: str) -> Future:
        """The step's graph: the parameters (one task holding them: Dask copies them to each worker that needs
        them and recomputes them if every copy is lost), one value-and-grad task per shard, and Dask's tree
        reduction of the shards' partials."""
        layer, params_key = f"{self.name}-shard-inputs-{step}", f"{self.name}-params-{step}"
        graph: dict[Any, Any] = {params_key: (tuple, list(params))}
        graph.update({(layer, k): [k, params_key, *parts] for k, parts in enumerate(shards)})
        total = db.Bag(graph, layer, len(shards)).reduction(
            functools.partial(_shard_value_and_grad, spec), functools.partial(_combine, self.reduce),
            name=f"{self.name}-value-and-grad")
        [future] = futures_of(self.client.persist(total, optimize_graph=False, retries=self.retries))
        return future

    def _shards(self, batch: Sequence[Any]) -> list[list[Future]]:
        """Per shard, a future per batch argument: lists of futures as given, else dask arrays' row chunks."""
        if all(isinstance(b, (list, tuple)) and b and all(isinstance(f, Future) for f in b) for b in batch):
            counts = {len(b) for b in batch}
            if len(counts) != 1:
                raise InputError(f"{self.name}: the batch arguments are lists of {sorted(counts)} futures; give "
                                 f"every batch argument one future per shard, in the same order")
            return [list(parts) for parts in zip(*batch)]
        if any(isinstance(b, (list, tuple)) and b and isinstance(b[0], Future) for b in batch):
            raise InputError(f"{self.name}: some batch arguments are lists of futures and some are not; place them "
                             f"all the same way (jg.distributed.shard places arrays together)")
        rows, token = self._rows(batch), uuid.uuid4().hex
        arrays = [_as_dask(b, rows, f"{self.name}-batch-{i}-{token}") for i, b in enumerate(batch)]
        chunks = [self.client.compute(a.to_delayed().ravel().tolist()) for a in arrays]
        return [list(parts) for parts in zip(*chunks)]

    def _rows(self, batch: Sequence[Any]) -> tuple[int, ...]:
        """The shards' row counts: the first dask batch argument's chunks, else `shards` nearly equal ones
        (numpy batches are then split so, and travel with this call's graph)."""
        lengths = {int(np.shape(b)[0]) if np.ndim(b) else -1 for b in batch}
        if len(lengths) != 1 or min(lengths) < 1:
            raise InputError(f"{self.name}: the batch arguments have {sorted(lengths)} rows (-1: a scalar); they "
                             f"must be arrays with the same number of rows (axis 0)")
        given = next((b for b in batch if isinstance(b, da.Array)), None)
        if given is not None:
            return tuple(c for c in given.chunks[0] if c)
        return _row_chunks(lengths.pop(), self.shards or sum(self.client.nthreads().values()))

    def _gather(self, futures: list[Future]) -> list[Any]:
        """The futures' results, with Dask's failures that a user can act on turned into jitgrad errors."""
        try:
            return self.client.gather(futures)
        except FutureCancelledError as exc:
            raise DistributedError(f"{self.name}: data this step needed was lost with a worker ({exc}). Dask "
                                   f"recomputes lost results from their tasks, but not data from client.scatter: "
                                   f"place batches with jg.distributed.shard (persisted dask arrays) and call "
                                   f"again; the workers' logs say why a worker died") from None


def value_and_grad(fn: Callable[..., Any], client: Client, *, argnums: int | Sequence[int] = 0,
                   batch_argnums: int | Sequence[int], reduce: Reduce = "mean", shards: int | None = None,
                   retries: int = 0) -> DistributedValueAndGrad:
    """`jg.value_and_grad(fn, argnums)` computed data-parallel on a Dask cluster: the arguments in `batch_argnums`
    are split along axis 0 and each shard runs on a worker; losses and gradients are combined as a mean over
    rows (`reduce="mean"`, fn is a mean over its batch) or a sum (`reduce="sum"`).

    Batch arguments may be numpy arrays (split into `shards` pieces, default one per worker thread, and sent
    with the call), dask arrays (each chunk along axis 0 is a shard, used where it lives: persist it, or use
    `shard`, to keep it on the workers between steps), or lists of futures, one per shard. `retries` is
    Dask's per-task retry count for tasks that raise; tasks on a worker that dies are rerun elsewhere anyway.
    """
    return DistributedValueAndGrad(fn, client, argnums, batch_argnums, reduce, shards, retries)


def fit(fn: Callable[..., Any], client: Client, params: Sequence[np.ndarray], batches: Sequence[Sequence[Any]], *,
        lr: float, epochs: int, reduce: Reduce = "mean") -> tuple[list[np.ndarray], list[float]]:
    """Plain SGD over the cluster on fn(*params, *batch): every batch is placed once (`shard`) and each epoch
    takes one step per batch. Returns the trained parameters (copies) and the loss of every step."""
    nparams = len(params)
    step = value_and_grad(fn, client, argnums=tuple(range(nparams)), reduce=reduce,
                          batch_argnums=tuple(range(nparams, nparams + len(batches[0]))))
    placed = [shard(client, *batch) for batch in batches]
    trained = [np.array(p, copy=True) for p in params]
    losses = []
    for _ in range(epochs):
        for batch in placed:
            value, grads = step(*trained, *batch)
            losses.append(float(value))
            for p, g in zip(trained, grads):
                p -= lr * g
    return trained, losses
