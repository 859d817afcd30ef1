"""Helpers shared by the interpreter and the reference evaluator (contracts, not gathering code).

* :func:`point_seed`, :func:`point_seeds`: the RNG seed of a random op at one point, so that random values
  depend only on ``(seed, stream, point)`` (:func:`stream`: the op's ordinal among the
  program's random ops), never on execution order; :class:`Seeds`: one seed per agent.
* :func:`draw_points`: the same draws for a random op vectorized over some of its dims.
* :func:`point_dict`: the ``{dim name: value}`` dict handed to UDFs and sinks.
* :func:`udf_outputs`: checks and converts what a UDF returned.
* :func:`udf_dlpack_outputs`: the same for UDFs with ``array_io = "dlpack"`` (backend tensors).
* :func:`user_code_error`: the error for an exception raised by user code (a sink, a UDF, an env).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.errors import RuntimeExecutionError, TimeRLError
from timerl.pdg.ir import Node
from timerl.pdg.ops import OpKind
from timerl.symbolic import Sym

_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's multipliers
_MIX1, _MIX2 = np.uint64(_M1), np.uint64(_M2)
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = 0xFFFFFFFFFFFFFFFF


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (wrapping arithmetic, elementwise)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class Seeds:
    """A run's RNG seed: ``base``, and for a program training agents along ``dim``
    (``trl.param(agents=...)``) one seed per agent: agent ``k``'s draws are those of a
    one-agent run with ``per_agent[k]`` (its point without ``dim``)."""

    base: int
    dim: Sym | None = None
    per_agent: tuple[int, ...] = ()

    def of(self, node: Node, point: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        """The seed and point of ``node``'s draw at ``point`` (a point of its domain)."""
        if self.dim is None or self.dim not in node.domain:
            return self.base, tuple(point)
        k = node.domain.index(self.dim)
        return self.per_agent[point[k]], tuple(point[:k]) + tuple(point[k + 1 :])

    def point_seed(self, node: Node, point: Sequence[int]) -> int:
        """:func:`point_seed` of ``node``'s (unvectorized) draw at ``point``."""
        seed, pt = self.of(node, point)
        return point_seed(seed, stream(node), pt)

    def point_seeds(self, node: Node, points: np.ndarray) -> np.ndarray:
        """:meth:`point_seed` at each row of ``points`` (``(n, len(node.domain))``), in NumPy."""
        pts = np.asarray(points, dtype=np.int64)
        if self.dim is None or self.dim not in node.domain:
            return point_seeds(self.base, stream(node), pts)
        k = node.domain.index(self.dim)
        base = np.asarray(self.per_agent, dtype=np.int64)[pts[:, k]]
        return point_seeds(base, stream(node), np.delete(pts, k, axis=1))


def stream(node: Node) -> int:
    """The RNG stream of a random op: its ``stream`` attribute (the random ops created
    before it, ``trl.rand``), else its node id."""
    return int(node.op.attr("stream", node.id))


def run_seeds(agent_dims: Sequence[Sym], bounds: Any, seed: int | Sequence[int]) -> Seeds:
    """The :class:`Seeds` of a run with ``seed`` (an int; or one per agent) of a program
    whose parameters vary over ``agent_dims`` (``bounds``: their bound values by dim). With
    an int, agent ``k`` draws as a one-agent run with ``seed + k``."""
    if not agent_dims:
        if not isinstance(seed, (int, np.integer)):
            raise TimeRLError(
                f"seed={seed!r}: one seed per agent needs parameters over an agent dim "
                "(trl.param(..., agents=(s,)) or DNNBuilder(seeds=...)); give an int"
            )
        return Seeds(int(seed))
    if len(agent_dims) > 1:
        raise TimeRLError(
            f"parameters vary over agent dims {[d.name for d in agent_dims]}: one agent dim per program "
            "(put seeds and settings on one dim, e.g. a grid flattened along s)"
        )
    (dim,) = agent_dims
    n = int(bounds[dim])
    if isinstance(seed, (int, np.integer)):
        return Seeds(int(seed), dim, tuple(int(seed) + k for k in range(n)))
    seeds = tuple(int(x) for x in seed)
    if len(seeds) != n:
        raise TimeRLError(
            f"seed={list(seeds)}: {len(seeds)} seeds for {n} agents along `{dim.name}`; give one per agent"
        )
    return Seeds(seeds[0], dim, seeds)


def point_seeds(seed: int | np.ndarray, nid: int, points: np.ndarray) -> np.ndarray:
    """31-bit seeds of ``(seed, nid, point)`` for each row of ``points`` (an ``(n, d)``
    integer array), computed elementwise in NumPy: stable across runs, processes and
    machines, and the same as :func:`point_seed` row by row. ``seed``: one for all rows,
    or one per row (agents, :class:`Seeds`)."""
    pts = np.ascontiguousarray(points, dtype=np.int64)
    if isinstance(seed, np.ndarray):
        h = (seed.astype(np.int64).view(np.uint64) & np.uint64(_MASK64)).copy()
    else:
        h = np.full(len(pts), int(seed) & _MASK64, dtype=np.uint64)
    h = _mix(_mix(h) ^ np.uint64((int(nid) * _GOLDEN) & _MASK64))
    for j in range(pts.shape[1]):
        h = _mix(h ^ (pts[:, j].view(np.uint64) + np.uint64((_GOLDEN * (j + 1)) & _MASK64)))
    return (h & np.uint64(0x7FFFFFFF)).astype(np.int64)


def _mix_int(z: int) -> int:
    """:func:`_mix` on one Python int (the same bits)."""
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def point_seed(seed: int, nid: int, point: Sequence[int]) -> int:
    """The seed :func:`point_seeds` gives ``point``, in plain Python (cheaper for one point)."""
    h = _mix_int(_mix_int(int(seed) & _MASK64) ^ ((int(nid) * _GOLDEN) & _MASK64))
    for j, p in enumerate(point):
        h = _mix_int(h ^ (((int(p) & _MASK64) + ((_GOLDEN * (j + 1)) & _MASK64)) & _MASK64))
    return h & 0x7FFFFFFF


def draw_seeds(node: Node, seed: Seeds, point: Sequence[int], dim_order: Sequence[Sym]) -> np.ndarray:
    """The seeds of a RAND node's per-point draws along its ``point_dims`` at ``point``
    (int32, one per row of :func:`draw_points`)."""
    base, points, _ = _seed_rows(node, seed, point, dim_order)
    return point_seeds(base, stream(node), points).astype(np.int32)


def draw_seeds_shifted(
    node: Node, seed: Seeds, point: Sequence[int], dim_order: Sequence[Sym], dim: Sym, shifts: np.ndarray
) -> np.ndarray:
    """:func:`draw_seeds` at ``point`` moved ``shifts[k]`` along ``dim``, for every ``k`` at
    once: an int32 array ``(len(shifts), rows)`` (a compiled iteration's seeds for a chunk
    of the iterations it runs)."""
    base, points, cols = _seed_rows(node, seed, point, dim_order)
    n, rows = len(shifts), len(points)
    many = np.repeat(points[None], n, axis=0)
    if dim in cols:
        many[:, :, cols[dim]] += np.asarray(shifts, np.int64)[:, None]
    bases = np.tile(base, n) if isinstance(base, np.ndarray) else base
    return point_seeds(bases, stream(node), many.reshape(n * rows, -1)).astype(np.int32).reshape(n, rows)


def _seed_rows(
    node: Node, seed: Seeds, point: Sequence[int], dim_order: Sequence[Sym]
) -> tuple[int | np.ndarray, np.ndarray, dict[Sym, int]]:
    """The base seed(s), the hashed points (one row per draw) and each dim's column in them."""
    pdims = tuple(node.op.attr("point_dims"))
    sizes = tuple(int(n) for n in node.batch[len(node.batch) - len(pdims) :])
    coords = dict(zip(node.domain, point, strict=True))
    order = [s for s in dim_order if s in coords or s in pdims]
    combos = np.indices(sizes).reshape(len(sizes), -1)
    column = {s: combos[k] for k, s in enumerate(pdims)}
    base: int | np.ndarray = seed.base
    if seed.dim is not None and seed.dim in order:  # each agent's rows: its seed, its point without the dim
        k = column[seed.dim] if seed.dim in column else np.full(combos.shape[1], coords[seed.dim])
        base = np.asarray(seed.per_agent, np.int64)[k]
        order = [s for s in order if s is not seed.dim]
    points = np.empty((combos.shape[1], len(order)), np.int64)
    for j, s in enumerate(order):
        points[:, j] = column[s] if s in column else coords[s]
    return base, points, {s: j for j, s in enumerate(order)}


def draw_points(
    be: Any,
    node: Node,
    seed: Seeds,
    point: Sequence[int],
    dim_order: Sequence[Sym],
    env: Any,
    seeds: Any = None,
) -> Any:
    """The value of a RAND node vectorized over its ``point_dims`` (the trailing batch dims)
    at ``point``: each row seeded with the seed of its per-point draw, so the values are
    those of the unvectorized node (one backend call for all rows). ``seeds``: those of
    :func:`draw_seeds` when already known (a traced array inside a compiled iteration)."""
    from timerl.backends.base import eval_int

    op = node.op
    pdims = tuple(op.attr("point_dims"))
    nfull = len(node.batch) - len(pdims)
    sizes, full = tuple(node.batch[nfull:]), tuple(node.batch[:nfull])
    if seeds is None:
        seeds = draw_seeds(node, seed, point, dim_order).tolist()
    shape = tuple(eval_int(x, env) for x in op.attr("shape"))
    out = be.random_points(seeds, full + shape, op.attr("dtype"), op.kind is OpKind.RAND_NORMAL)
    out = out.reshape(sizes + full + shape)
    k, nb = len(sizes), len(full)
    if nb == 0:
        return out
    perm = tuple(range(k, k + nb)) + tuple(range(k)) + tuple(range(k + nb, k + nb + len(shape)))
    return be.permute_axes(out, perm)


def point_dict(domain: Sequence[Sym], point: Sequence[int]) -> dict[str, int]:
    """``{dim name: coordinate}`` for a point of a node's domain."""
    return {s.name: int(p) for s, p in zip(domain, point, strict=True)}


def user_code_error(kind: str, node: Node, exc: Exception, pd: dict[str, int]) -> RuntimeExecutionError:
    """The error for ``exc``, raised by the user code that ``node`` (a ``kind``: sink, UDF)
    ran at point ``pd``: it names the node, the point and the function and line where
    ``exc`` was raised. Raise it ``from exc``: Python then prints the user's own traceback
    first ("The above exception was the direct cause of the following exception")."""
    who = f"{kind} {node.label} defined at {node.where}" if node.name else node.label
    batch = f", all of {', '.join(d.name for d in node.batch_dims)} at once" if node.batch_dims else ""
    frames = traceback.extract_tb(exc.__traceback__)
    at = (
        f"; raised in {frames[-1].name} ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
        if frames
        else ""
    )
    return RuntimeExecutionError(
        f"{who} raised {type(exc).__name__}: {exc} (at point {pd}{batch}{at}; its traceback is above)"
    )


def udf_outputs(node: Node, result: Any, pd: dict[str, int]) -> list[np.ndarray]:
    """Validate a UDF's return value: one array per output, cast to the declared dtypes.

    Shapes are checked against ``batch + shape`` when the declared per-point shape is
    concrete (all ints).
    """
    n = len(node.outputs)
    if isinstance(result, np.ndarray) or not isinstance(result, (list, tuple)):
        if n != 1:
            raise RuntimeExecutionError(
                f"UDF {node.label} at point {pd} must return a list of {n} arrays, got {type(result).__name__}"
            )
        result = [result]
    if len(result) != n:
        raise RuntimeExecutionError(
            f"UDF {node.label} at point {pd} returned {len(result)} values, but it declares {n} outputs"
        )
    out = []
    for k, (r, spec) in enumerate(zip(result, node.outputs, strict=True)):
        a = np.asarray(r, dtype=spec.dtype.numpy)
        if all(isinstance(s, int) for s in spec.shape):
            want = tuple(node.batch) + tuple(int(s) for s in spec.shape)
            if a.shape != want:
                raise RuntimeExecutionError(
                    f"UDF {node.label} at point {pd}: output {k} has shape {a.shape}, expected {want} "
                    f"(batch {tuple(node.batch)} + per-point shape {tuple(spec.shape)})"
                )
        out.append(a)
    return out


def udf_dlpack_outputs(node: Node, result: Any, pd: dict[str, int], be: Any) -> list[Any]:
    """Import what a ``array_io = "dlpack"`` UDF returned as backend tensors (no copy where possible).

    Each output must support ``__dlpack__``; it goes through ``be.from_dlpack``. Shapes are
    checked like :func:`udf_outputs`; a dtype other than the declared one is cast.
    """
    n = len(node.outputs)
    if isinstance(result, (list, tuple)):
        res = list(result)
    else:
        res = [result]
        if n != 1:
            raise RuntimeExecutionError(
                f"UDF {node.label} at point {pd} must return a list of {n} arrays, got {type(result).__name__}"
            )
    if len(res) != n:
        raise RuntimeExecutionError(
            f"UDF {node.label} at point {pd} returned {len(res)} values, but it declares {n} outputs"
        )
    out = []
    for k, (r, spec) in enumerate(zip(res, node.outputs, strict=True)):
        if not hasattr(r, "__dlpack__"):
            raise RuntimeExecutionError(
                f"UDF {node.label} at point {pd}: output {k} is a {type(r).__name__}, but a UDF with "
                "array_io='dlpack' must return objects with __dlpack__ (e.g. jax.Array, torch.Tensor)"
            )
        x = be.from_dlpack(r)
        if all(isinstance(s, int) for s in spec.shape):
            want = tuple(node.batch) + tuple(int(s) for s in spec.shape)
            if tuple(x.shape) != want:
                raise RuntimeExecutionError(
                    f"UDF {node.label} at point {pd}: output {k} has shape {tuple(x.shape)}, expected "
                    f"{want} (batch {tuple(node.batch)} + per-point shape {tuple(spec.shape)})"
                )
        # "float32" / "torch.float32" / "bool" / "torch.bool": compare the last component.
        if str(x.dtype).rpartition(".")[2] != np.dtype(spec.dtype.numpy).name:
            x = be.cast_like(x, be.zeros((), spec.dtype))
        out.append(x)
    return out


def call_udf(node: Node, fn: Any, ins: Sequence[Any], pd: dict[str, int], be: Any) -> list[Any]:
    """Run UDF ``fn`` of ``node`` on backend tensors ``ins`` at point ``pd``; its outputs as
    backend tensors. ``array_io = "dlpack"``: tensors in and out through DLPack; else NumPy
    copies in, checked and cast arrays out (``udf_outputs``). An exception of ``fn`` becomes
    :func:`user_code_error`."""
    dlpack = getattr(fn, "array_io", "numpy") == "dlpack"
    args = [be.to_dlpack(x) for x in ins] if dlpack else [np.array(be.to_numpy(x)) for x in ins]
    try:
        res = fn(args, pd)
    except Exception as exc:
        raise user_code_error("UDF", node, exc, pd) from exc
    if dlpack:
        return udf_dlpack_outputs(node, res, pd, be)
    return be.from_numpy_all(udf_outputs(node, res, pd))


def eval_shape(shape: Sequence[Any], env: Any, node: Node) -> tuple[int, ...]:
    """A per-point shape with symbolic entries evaluated in ``env``."""
    from timerl.symbolic import Expr, evaluate

    try:
        return tuple(int(evaluate(s, env)) if isinstance(s, Expr) else int(s) for s in shape)
    except TimeRLError as exc:
        raise RuntimeExecutionError(
            f"cannot evaluate the per-point shape {tuple(shape)} of {node.label}: {exc}"
        ) from exc
