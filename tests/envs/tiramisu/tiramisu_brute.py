"""Brute-force oracles for the Tiramisu env tests: enumerate every statement instance of
a small program, run it in Python (NumPy arrays, the harness's initial values), and
check a schedule's legality from all pairs of conflicting accesses."""

from __future__ import annotations

import itertools

import islpy as isl
import numpy as np

from timerl.envs.tiramisu.program import Program, affine_row
from timerl.envs.tiramisu.schedule import Schedule, initial_schedule


def instances(p: Program) -> list[tuple[int, tuple[int, ...]]]:
    out = []
    for k, st in enumerate(p.statements):
        dom = isl.Set.read_from_str(p.ctx, "{ " + st.isl_domain() + " }")
        pts: list[tuple[int, ...]] = []
        dom.foreach_point(
            lambda pt, pts=pts, d=st.depth: pts.append(
                tuple(pt.get_coordinate_val(isl.dim_type.set, j).to_python() for j in range(d))
            )
        )
        out += [(k, x) for x in pts]
    return out


def time_of(sched: Schedule, k: int, x: tuple[int, ...]) -> tuple[int, ...]:
    s = sched.stmts[k]
    out = [s.betas[0]]
    for lvl, b in zip(s.levels, s.betas[1:], strict=True):
        v = sum(c * xi for c, xi in zip(lvl.coeffs, x, strict=True)) + lvl.shift
        out += [v // lvl.tile if lvl.tile else v, b]
    return tuple(out + [0] * (sched.width - len(out)))


def _cell(p: Program, k: int, acc, x) -> tuple:
    st = p.statements[k]
    return (acc.array,) + tuple(
        sum(c * xi for c, xi in zip(row[:-1], x, strict=True)) + row[-1]
        for row in (affine_row(e, st.iterators) for e in acc.index)
    )


def conflicts(p: Program) -> list[tuple[tuple[int, tuple], tuple[int, tuple]]]:
    """Every ordered pair (earlier, later) of instances touching one cell, one a write."""
    init = initial_schedule(p)
    order = sorted(instances(p), key=lambda kx: time_of(init, *kx))
    last_w: dict[tuple, list] = {}
    reads_since: dict[tuple, list] = {}
    pairs = []
    for k, x in order:
        st = p.statements[k]
        for acc in st.reads:
            c = _cell(p, k, acc, x)
            pairs += [(w, (k, x)) for w in last_w.get(c, [])]
            reads_since.setdefault(c, []).append((k, x))
        c = _cell(p, k, st.write, x)
        pairs += [(w, (k, x)) for w in last_w.get(c, [])]
        pairs += [(r, (k, x)) for r in reads_since.get(c, []) if r != (k, x)]
        last_w.setdefault(c, []).append((k, x))
    return pairs


def legal(p: Program, sched: Schedule, pairs=None) -> bool:
    pairs = conflicts(p) if pairs is None else pairs
    for (ka, xa), (kb, xb) in pairs:
        ta, tb = time_of(sched, ka, xa), time_of(sched, kb, xb)
        if not ta < tb:
            return False
        for b, lvl in enumerate(sched.parallel):
            if lvl < 0:
                continue
            d = 2 * lvl + 1
            if (
                ta[:d] == tb[:d]
                and ta[d] != tb[d]
                and sched.branch_of(ka) == b
                or (ta[:d] == tb[:d] and ta[d] != tb[d] and sched.branch_of(kb) == b)
            ):
                return False
    return True


def initial_values(p: Program) -> dict[str, np.ndarray]:
    """The C harness's init(): element i of array number k is ((i*7919 + k*131 + 17) % 1009) / 1009."""
    out = {}
    for k, a in enumerate(p.arrays):
        n = int(np.prod(a.shape))
        i = np.arange(n, dtype=np.int64)
        out[a.name] = (((i * 7919 + k * 131 + 17) % 1009).astype(np.float32) / np.float32(1009.0)).reshape(
            a.shape
        )
    return out


def run_python(p: Program) -> np.ndarray:
    """The program run in its original order (float32), output arrays flattened."""
    vals = initial_values(p)
    init = initial_schedule(p)
    for k, x in sorted(instances(p), key=lambda kx: time_of(init, *kx)):
        st = p.statements[k]
        reads = [f"np.float32(vals[{r.array!r}][{_cell(p, k, r, x)[1:]}])" for r in st.reads]
        expr = st.body.format(*reads).replace("f)", ")").replace("f ", " ")
        expr = _floats(expr)
        vals[st.write.array][_cell(p, k, st.write, x)[1:]] = np.float32(eval(expr, {"np": np, "vals": vals}))
    return np.concatenate([vals[a.name].reshape(-1) for a in p.arrays if a.output])


def _floats(expr: str) -> str:
    import re

    return re.sub(r"(\d+\.\d+)f", r"np.float32(\1)", expr)


__all__ = ["conflicts", "instances", "legal", "run_python", "time_of", "itertools"]
