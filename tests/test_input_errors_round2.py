"""Mistakes that raised raw TypeErrors and AttributeErrors from inside jitgrad (or were silently accepted) raise
jitgrad errors naming what is wrong and what to write instead: unhashable static arguments, optimizer
hyperparameters of the wrong type or range, optimizer states that do not fit the parameters, a closed Dask
client."""
import numpy as np
import pytest

import jitgrad as jg


class EqualsAll:
    """Defines __eq__ and no __hash__, so Python makes it unhashable."""

    def __eq__(self, other: object) -> bool:
        return True


@pytest.mark.parametrize("value, kind", [({"a": 1}, "dict"), ({1, 2}, "set"), ([1, 2], "list"),
                                         (EqualsAll(), "EqualsAll"), ((1, {"a": 1}), "tuple")])
def test_unhashable_static_arguments_are_input_errors(value, kind):
    f = jg.trace(lambda x, s: np.sum(x) * 2.0, static_argnums=1)
    for call in (f, f.value_and_grad, f.grad):
        with pytest.raises(jg.InputError, match=rf"static argument 1 is a {kind}, which is not hashable.*"
                                                rf"tuple\(sorted\(d\.items\(\)\)\) for a dict"):
            call(np.ones(2), value)
    assert f(np.ones(2), (1, 2)) == 4.0  # a hashable static value still works after the refusals
    assert f.cache_info()["misses"] == 1


@pytest.mark.parametrize("make, message", [
    (lambda: jg.optim.Adam(betas=0.9), r"Adam: betas must be a pair \(beta1, beta2\), got 0.9; write e.g."),
    (lambda: jg.optim.AdamW(betas=(0.9, 0.99, 0.999)), r"AdamW: betas must be a pair"),
    (lambda: jg.optim.Adam(betas=(0.9, "0.999")), r"Adam: betas\[1\] must be a real number, got '0.999' \(str\)"),
    (lambda: jg.optim.SGD(lr=np.array([0.1])), r"SGD: lr must be a real number, got array\(\[0.1\]\) \(ndarray\)"),
    (lambda: jg.optim.SGD(lr="0.1"), r"SGD: lr must be a real number, got '0.1' \(str\); pass a Python float"),
    (lambda: jg.optim.SGD(0.1, momentum=None), r"SGD: momentum must be a real number, got None"),
    (lambda: jg.optim.SGD(0.1, momentum=0.9, nesterov="yes"), r"SGD: nesterov must be True or False, got 'yes'"),
    (lambda: jg.optim.Adam(amsgrad=1), r"Adam: amsgrad must be True or False, got 1 \(int\)"),
    (lambda: jg.optim.SGD(lr=-0.1), r"SGD: lr must be >= 0, got -0.1"),
    (lambda: jg.optim.SGD(lr=float("nan")), r"SGD: lr must be >= 0, got nan"),
    (lambda: jg.optim.SGD(0.1, momentum=-0.5), r"SGD: momentum must be >= 0, got -0.5"),
    (lambda: jg.optim.SGD(0.1, weight_decay=-1e-4), r"SGD: weight_decay must be >= 0"),
    (lambda: jg.optim.SGD(0.1, momentum=0.9, dampening=0.1, nesterov=True), r"nesterov=True needs momentum > 0 "
                                                                             r"and dampening 0"),
    (lambda: jg.optim.Adam(eps=-1e-8), r"Adam: eps must be >= 0, got -1e-08"),
    (lambda: jg.optim.AdamW(weight_decay=-0.01), r"AdamW: weight_decay must be >= 0"),
    (lambda: jg.optim.Adam(betas=(1.0, 0.999)), r"Adam: betas\[0\] must be in \[0, 1\), got 1.0"),
    (lambda: jg.optim.Adam(betas=(0.9, -0.1)), r"Adam: betas\[1\] must be in \[0, 1\), got -0.1"),
])
def test_optimizer_hyperparameters_are_checked_at_construction(make, message):
    with pytest.raises(jg.InputError, match=message):
        make()


def test_optimizer_hyperparameters_take_real_numbers_of_any_kind():
    sgd = jg.optim.SGD(lr=np.float64(0.1), momentum=np.array(0.9), nesterov=np.bool_(True), weight_decay=0)
    assert (sgd.lr, sgd.momentum, sgd.weight_decay, sgd.nesterov) == (0.1, 0.9, 0.0, True)
    assert all(type(v) is float for v in (sgd.lr, sgd.momentum, sgd.dampening, sgd.weight_decay))
    adam = jg.optim.Adam(lr=1, betas=np.array([0.8, 0.99]), eps=np.float32(0.0))
    assert adam.betas == (0.8, 0.99) and type(adam.betas[0]) is float and adam.lr == 1.0 and adam.eps == 0.0
    assert hash(adam) == hash(jg.optim.Adam(lr=1.0, betas=(0.8, 0.99), eps=0.0))  # usable as a static argument


def params_and_grads() -> tuple[dict, dict]:
    params = {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32), "count": np.arange(3)}
    return params, {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32), "count": None}


@pytest.mark.parametrize("opt", [jg.optim.Adam(amsgrad=True), jg.optim.AdamW(), jg.optim.SGD(0.1, momentum=0.9)],
                         ids=["Adam", "AdamW", "SGD"])
def test_a_state_for_other_parameters_is_refused_naming_the_leaf_and_shapes(opt):
    params, grads = params_and_grads()
    name = type(opt).__name__
    field = "momentum_buffer" if name == "SGD" else "exp_avg_sq"
    state = opt.init(params)
    other = opt.init({"w": np.ones(3, np.float32), "b": np.zeros(2, np.float32), "count": np.arange(3)})
    with pytest.raises(jg.InputError, match=rf"{name}.update: state.\w+ at \['w'\] is float32\[3\] but its "
                                            rf"parameter is float32\[3, 2\]; pass the state {name}.init\(params\)"):
        opt.update(params, grads, other)
    wrong_dtype = state._replace(**{field: {**getattr(state, field), "b": np.zeros(2)}})
    with pytest.raises(jg.InputError, match=rf"state.{field} at \['b'\] is float64\[2\] but its parameter is "
                                            rf"float32\[2\]"):
        opt.update(params, grads, wrong_dtype)
    missing = state._replace(**{field: {"w": getattr(state, field)["w"]}})
    with pytest.raises(jg.InputError, match=rf"(?s)state.{field} must have the structure of params.*; pass the state"):
        opt.update(params, grads, missing)
    with pytest.raises(jg.InputError, match=r"state.step is 0 \(int\), not a 0-d integer array"):
        opt.update(params, grads, state._replace(step=0))
    wrong_kind = (jg.optim.Adam() if name == "SGD" else jg.optim.SGD(0.1)).init(params)
    with pytest.raises(jg.InputError, match=rf"state is a {type(wrong_kind).__name__}, not a {type(state).__name__}"):
        opt.update(params, grads, wrong_kind)
    with pytest.raises(jg.InputError, match=r"the gradient at \['w'\] is a dict but its parameter is float32\[3, 2\]"):
        opt.update(params, {**grads, "w": {"x": np.ones((3, 2), np.float32)}}, state)
    new, _ = opt.update(params, grads, state)  # the state init made still fits
    assert new["w"].shape == (3, 2) and new["w"].dtype == np.float32 and new["count"] is params["count"]


def test_a_traced_step_checks_the_state_when_it_traces():
    opt = jg.optim.Adam()
    params, grads = params_and_grads()
    step = jg.trace(lambda p, g, s: opt.update(p, g, s))
    other = opt.init({"w": np.ones((1, 2), np.float32), "b": np.zeros(2, np.float32), "count": np.arange(3)})
    with pytest.raises(jg.InputError, match=r"state.exp_avg at \['w'\] is float32\[1, 2\] but its parameter is "
                                            r"float32\[3, 2\]"):
        step(params, grads, other)
    new, state = step(params, grads, opt.init(params))
    assert new["w"].shape == (3, 2) and int(state.step) == 1


def loss(w, x):
    return np.sum(x @ w)


def test_a_closed_dask_client_is_named_with_what_to_do():
    pytest.importorskip("dask.distributed")
    from dask.distributed import Client, LocalCluster

    from jitgrad import distributed as jgd
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        client = Client(cluster)
        step = jgd.value_and_grad(loss, client, batch_argnums=1, reduce="sum")
        value, grad = step(np.ones(3), np.ones((4, 3)))
        assert value == 12.0 and np.all(grad == 4.0)
        client.close()
        closed = r"the Dask client is closed; create a new one"
        with pytest.raises(jgd.DistributedError, match=rf"loss: {closed}"):
            step(np.ones(3), np.ones((4, 3)))
        with pytest.raises(jgd.DistributedError, match=rf"loss: {closed}"):
            jgd.value_and_grad(loss, client, batch_argnums=1, reduce="sum")
        with pytest.raises(jgd.DistributedError, match=rf"shard: {closed}"):
            jgd.shard(client, np.ones((4, 3)))
        assert "No scheduler connected" in repr(step)
        with Client(cluster) as fresh:
            value, _ = jgd.value_and_grad(loss, fresh, batch_argnums=1, reduce="sum")(np.ones(3), np.ones((4, 3)))
            assert value == 12.0
