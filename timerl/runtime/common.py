"""Helpers shared by the interpreter and the reference evaluator (contracts, not gathering code).

* :func:`point_seed`: the RNG seed of a random op at one point, so that random values
  depend only on ``(seed, node id, point)``, never on execution order.
* :func:`draw_points`: the same draws for a random op vectorized over some of its dims.
* :func:`point_dict`: the ``{dim name: value}`` dict handed to UDFs and sinks.
* :func:`udf_outputs`: checks and converts what a UDF returned.
* :func:`udf_dlpack_outputs`: the same for UDFs with ``array_io = "dlpack"`` (backend tensors).
* :func:`user_code_error`: the error for an exception raised by user code (a sink, a UDF, an env).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from timerl.errors import RuntimeExecutionError, TimeRLError
from timerl.pdg.ir import Node
from timerl.pdg.ops import OpKind
from timerl.symbolic import Sym


def point_seed(seed: int, nid: int, point: tuple[int, ...]) -> int:
    """A 31-bit seed derived from ``(seed, nid, point)`` (stable across runs and processes)."""
    text = f"{int(seed)}/{int(nid)}/{','.join(str(int(p)) for p in point)}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & 0x7FFFFFFF


def draw_points(
    be: Any, node: Node, seed: int, point: Sequence[int], dim_order: Sequence[Sym], env: Any
) -> Any:
    """The value of a RAND node vectorized over its ``point_dims`` (the trailing batch dims)
    at ``point``: each row seeded with the seed of its per-point draw, so the values are
    those of the unvectorized node (one backend call for all rows)."""
    from timerl.backends.base import eval_int

    op = node.op
    pdims = tuple(op.attr("point_dims"))
    nfull = len(node.batch) - len(pdims)
    sizes, full = tuple(node.batch[nfull:]), tuple(node.batch[:nfull])
    coords = dict(zip(node.domain, point, strict=True))
    order = [s for s in dim_order if s in coords or s in pdims]
    seeds = []
    for combo in itertools.product(*(range(int(n)) for n in sizes)):
        coords.update(zip(pdims, combo, strict=True))
        seeds.append(point_seed(seed, node.id, tuple(coords[s] for s in order)))
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


def eval_shape(shape: Sequence[Any], env: Any, node: Node) -> tuple[int, ...]:
    """A per-point shape with symbolic entries evaluated in ``env``."""
    from timerl.symbolic import Expr, evaluate

    try:
        return tuple(int(evaluate(s, env)) if isinstance(s, Expr) else int(s) for s in shape)
    except TimeRLError as exc:
        raise RuntimeExecutionError(
            f"cannot evaluate the per-point shape {tuple(shape)} of {node.label}: {exc}"
        ) from exc
