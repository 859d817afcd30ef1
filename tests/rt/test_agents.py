"""Many agents in one program (issue 34): parameters over an agent dim ``s``
(``trl.param(agents=(s,))``, ``DNNBuilder(seeds=...)``), settings varying over ``s``, and
random draws seeded per agent: agent ``k`` of a K-agent run equals a one-agent run with
agent ``k``'s seed, init and settings, bit for bit (on JAX a contraction batched over the
agents may differ by one ulp: XLA's batched dot sums in another order)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl

K = 3
X = np.random.default_rng(0).normal(size=(16, 2)).astype(np.float32)
Y = (X @ np.array([1.5, -2.0], np.float32)).astype(np.float32)
INITS = np.random.default_rng(1).normal(size=(K, 2)).astype(np.float32)
LRS = np.array([0.01, 0.05, 0.1], np.float32)
SEEDS = [7, 3, 11]


def _regression(k: int | None, opt: str, backend: str) -> dict[tuple[Any, int], np.ndarray]:
    """Least squares by ``opt``; ``k=None``: all K agents (init and learning rate per agent)."""
    got: dict[tuple[Any, int], np.ndarray] = {}
    ctx = trl.Context(dims=("i", "s"))
    with ctx as ((i, I), (s, S)):
        if k is None:
            w = trl.param(INITS, domain=(i, s), agents=(s,), name="w")
            lr: Any = trl.const(LRS)[s]
        else:
            w = trl.param(INITS[k], domain=(i,), name="w")
            lr = float(LRS[k])
        ((trl.const(X) @ w - trl.const(Y)) ** 2).mean().backward()
        if opt == "adam":
            trl.optim.Adam([w], lr=lr).step()
        else:
            trl.optim.SGD([w], lr=lr, momentum=0.9).step()
        w.sink(lambda v, p: got.__setitem__((p.get("s"), p["i"]), np.array(v)))
    ctx.compile({S: K, I: 4} if k is None else {I: 4}, backend=backend).execute()
    return got


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_each_agent_trains_as_it_would_alone(backend: str, opt: str) -> None:
    many = _regression(None, opt, backend)
    assert sorted(many) == [(k, i) for k in range(K) for i in range(4)]
    for k in range(K):
        one = _regression(k, opt, backend)
        for i in range(4):
            if backend == "torch":
                np.testing.assert_array_equal(many[(k, i)], one[(None, i)])
            else:  # XLA's dot batched over the agents may sum in another order: 1 ulp apart
                np.testing.assert_allclose(many[(k, i)], one[(None, i)], rtol=1e-6, atol=0)
    assert not np.array_equal(many[(0, 3)], many[(1, 3)])


def _noisy(k: int | None, backend: str, seed: Any, **options: Any) -> dict[tuple[Any, int], np.ndarray]:
    """Parameters pushed around by uniform and normal draws over (s, b, i, t)."""
    got: dict[tuple[Any, int], np.ndarray] = {}
    ctx = trl.Context(dims=("b", "i", "t", "s") if k is None else ("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T), *agent):
        dom = (b, i, t, agent[0][0]) if agent else (b, i, t)
        init = np.arange(K * 2, dtype=np.float32).reshape(K, 2) * 0.1
        if agent:
            w = trl.param(init, domain=(i, agent[0][0]), agents=(agent[0][0],), name="w")
        else:
            w = trl.param(init[k], domain=(i,), name="w")
        x = (w + trl.randn((2,), domain=dom)) * trl.rand((), domain=dom)
        (x * x).sum().backward()
        trl.optim.Adam([w], lr=0.1).step()
        w.sink(lambda v, p: got.__setitem__((p.get("s"), p["i"]), np.array(v)))
    bounds = {B: 4, I: 3, T: 5}
    if agent:
        bounds[agent[0][1]] = K
    ctx.compile(bounds, backend=backend, seed=seed, **options).execute()
    return got


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize(
    "options", [{}, {"vectorize_time": False}, {"vectorize": False}], ids=["default", "t", "none"]
)
def test_random_draws_are_seeded_per_agent(backend: str, options: dict) -> None:
    """``seed=[7, 3, 11]``: agent k draws what a one-agent run with ``seed=SEEDS[k]`` draws,
    whether the agent dim is vectorized (rows seeded per agent) or not; ``seed=7`` gives
    agents the seeds 7, 8, 9."""
    many = _noisy(None, backend, SEEDS, **options)
    for k, seed in enumerate(SEEDS):
        one = _noisy(k, backend, seed, **options)
        for i in range(3):
            np.testing.assert_array_equal(many[(k, i)], one[(None, i)])
    counted = _noisy(None, backend, 7, **options)
    np.testing.assert_array_equal(counted[(0, 2)], many[(0, 2)])
    np.testing.assert_array_equal(counted[(1, 2)], _noisy(1, backend, 8, **options)[(None, 2)])


def _first_layer(seeds: list[int] | None, seed: int = 0) -> dict[Any, np.ndarray]:
    """The first weight matrix of a DNNBuilder network (3 -> 4 -> 2) at i = 0, per agent."""
    got: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("i", "s") if seeds else ("i",))
    with ctx as ((i, I), *agent):
        b = trl.DNNBuilder(
            domain=(i, agent[0][0]) if agent else (i,),
            seed=seed,
            seeds=seeds,
            agents=agent[0][:1] if agent else (),
        )
        b.obs_dim, b.out_dim, b.hidden = 3, 2, [4]
        net = b.build()
        net.params[0].sink(lambda v, p: got.__setitem__(p.get("s"), np.array(v)) if p["i"] == 0 else None)
    bounds = {I: 1}
    if agent:
        bounds[agent[0][1]] = len(seeds or ())
    ctx.compile(bounds, backend="torch").execute()
    return got


def test_dnn_builder_seeds_initialise_each_agent_as_its_own_builder() -> None:
    many = _first_layer(SEEDS)
    for k, seed in enumerate(SEEDS):
        np.testing.assert_array_equal(many[k], _first_layer(None, seed)[None])
    assert not np.array_equal(many[0], many[1])


def test_agent_errors_name_the_parameter_and_the_fix() -> None:
    ctx = trl.Context(dims=("i", "s", "b"))
    with ctx as ((i, I), (s, S), (b, B)):
        with pytest.raises(trl.RTDefinitionError, match="must be dims of its domain"):
            trl.param(INITS, domain=(i, s), agents=(b,), name="w")
        w = trl.param(INITS, domain=(i, s), agents=(s,), name="w")
        (w * w).sum().backward()
        trl.optim.SGD([w], lr=0.1).step()
        w.sink(lambda v, p: None)
    with pytest.raises(trl.BoundError, match="'w' holds 3 agents along `s`"):
        ctx.compile({S: 4, I: 2}, backend="torch")
    with pytest.raises(trl.TimeRLError, match="2 seeds for 3 agents"):
        ctx.compile({S: 3, I: 2}, backend="torch", seed=[1, 2]).execute()


def _rows_times_agent_weights(k: int | None, backend: str) -> tuple[dict[tuple[Any, int], np.ndarray], Any]:
    """Rows of a rollout over envs ``b`` and steps ``t`` times a (2, 3) weight per agent,
    trained by SGD on the rows' sum."""
    got: dict[tuple[Any, int], np.ndarray] = {}
    w0 = np.random.default_rng(5).normal(size=(K, 2, 3)).astype(np.float32)
    ctx = trl.Context(dims=("b", "i", "t", "s"))
    with ctx as ((b, B), (i, I), (t, T), (s, S)):
        if k is None:
            w = trl.param(w0, domain=(i, s), agents=(s,), name="w")
        else:
            w = trl.param(w0[k], domain=(i,), name="w")
        o = trl.empty((2,), domain=(b, i, t), name="o")
        o[b, i, 0] = trl.const(X)[b] + trl.as_tensor(i) * 0.01
        o[b, i, t + 1] = (o * 0.9).tanh() + 0.05
        ((((o @ w).tanh() - 0.5) ** 2).sum()).backward()
        trl.optim.SGD([w], lr=0.05).step()
        w.sink(lambda v, p: got.__setitem__((p.get("s"), p["i"]), np.array(v)))
    bounds = {B: 16, I: 3, T: 5}
    ex = ctx.compile({**bounds, S: K} if k is None else bounds, backend=backend)
    ex.execute()
    return got, ex.pdg


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_products_read_agent_weights_without_a_copy_per_point(backend: str) -> None:
    """A product batched over (b, s) reads the weights of agent s with a size-1 ``b`` dim
    (no copy of them per row: ``plan/layout``), and agent k still trains as it would alone."""
    from timerl.pdg.ops import OpKind
    from timerl.plan.layout import input_layout

    many, pdg = _rows_times_agent_weights(None, backend)
    expands = [
        arg
        for e in pdg.edges
        if pdg.nodes[e.sink].op.kind is OpKind.MATMUL and e.src in pdg.nodes
        for kind, arg in input_layout(pdg.nodes[e.src], pdg.nodes[e.sink], e).steps
        if kind == "expand"
    ]
    assert expands and all(full is None for _, _, full in expands), expands
    for k in range(K):
        one, _ = _rows_times_agent_weights(k, backend)
        for i in range(3):
            # products batched over the agents sum in another order than one agent's (both
            # backends, with or without the weights copied per point): a few ulps in 3 steps
            np.testing.assert_allclose(many[(k, i)], one[(None, i)], rtol=1e-5, atol=1e-7)
