"""The state as a padded AST graph (§2.2.2): fixed-shape node features, adjacency, mask.

Nodes: a root; per branch, one *iterator* node per current loop level (a chain under
the root, outermost first) and one *computation* node per statement, attached to the
branch's innermost level. Edges are undirected, with self-loops. Each node's feature
vector (``NUM_FEATURES``) starts with its type (0 iterator, 1 computation);
computation features (write and read access matrices, padded to ``MAX_ARRAY_DIMS x
(MAX_DEPTH + 1)`` each, the number of reads, the depth, the focus flag) come first,
iterator features (extent, tile size, parallel / unroll tags, focus flag, shift, whether
another branch shares the loop (fusion, or a stencil's time loop), the level's row of the
schedule matrix over the original iterators) come last, as in
the paper's Fig. 2.2. Padding nodes are zero with mask 0.
"""

from __future__ import annotations

import functools
import math

import islpy as isl
import numpy as np

from timerl.envs.tiramisu.program import (
    MAX_ARRAY_DIMS,
    MAX_DEPTH,
    MAX_READS,
    Program,
    UnsupportedProgramError,
    affine_row,
)
from timerl.envs.tiramisu.schedule import MAX_LEVELS, Level, Schedule

__all__ = ["MAX_NODES", "NUM_FEATURES", "OBS_SIZE", "check_representable", "graph", "flatten", "unflatten"]

MAX_NODES = 32
_ACC = MAX_ARRAY_DIMS * (MAX_DEPTH + 1)
COMP_FEATURES = _ACC * (1 + MAX_READS) + 3
ITER_FEATURES = 8 + MAX_DEPTH
NUM_FEATURES = 1 + COMP_FEATURES + ITER_FEATURES
OBS_SIZE = MAX_NODES * NUM_FEATURES + MAX_NODES * MAX_NODES + MAX_NODES


def check_representable(p: Program) -> None:
    """Raise :class:`UnsupportedProgramError` if the graph of some schedule may not fit."""
    need = 1 + len(p.branches) * MAX_LEVELS + len(p.statements)
    if need > MAX_NODES:
        raise UnsupportedProgramError(
            f"program {p.name}: {len(p.branches)} branches and {len(p.statements)} statements need up to "
            f"{need} graph nodes; the state has {MAX_NODES} (use fewer branches/statements)"
        )


def _access_matrix(expr_rows: tuple[str, ...], iterators: tuple[str, ...]) -> np.ndarray:
    m = np.zeros((MAX_ARRAY_DIMS, MAX_DEPTH + 1), np.float32)
    for r, e in enumerate(expr_rows):
        row = affine_row(e, iterators)
        m[r, : len(iterators)] = row[:-1]
        m[r, MAX_DEPTH] = row[-1] / 8.0
    return m


@functools.lru_cache(maxsize=4096)
def _extent(p: Program, stmt: int, level: Level) -> float:
    st = p.statements[stmt]
    dom = isl.Set.read_from_str(p.ctx, "{ " + st.isl_domain() + " }")
    aff = isl.PwAff.read_from_str(
        p.ctx, f"{{ {st.name}[{', '.join(st.iterators)}] -> [{level.isl_expr(st.iterators)}] }}"
    )
    img = isl.Map.from_pw_aff(aff).intersect_domain(dom).range()
    lo = img.lexmin().sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()
    hi = img.lexmax().sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()
    return float(hi - lo + 1)


@functools.lru_cache(maxsize=256)
def _comp_features(p: Program, stmt: int) -> np.ndarray:
    st = p.statements[stmt]
    f = np.zeros(COMP_FEATURES, np.float32)
    f[:_ACC] = _access_matrix(st.write.index, st.iterators).reshape(-1)
    for r, acc in enumerate(st.reads):
        f[_ACC * (1 + r) : _ACC * (2 + r)] = _access_matrix(acc.index, st.iterators).reshape(-1)
    f[-3] = len(st.reads) / MAX_READS
    f[-2] = st.depth / MAX_DEPTH
    return f


def _shared(sched: Schedule, stmts: list[int], level: int) -> bool:
    """Some statement outside ``stmts`` (a branch) runs inside the branch's loop ``level``."""
    prefix = sched.stmts[stmts[0]].betas[: level + 1]
    return any(
        k not in stmts and len(s.levels) > level and s.betas[: level + 1] == prefix
        for k, s in enumerate(sched.stmts)
    )


def graph(sched: Schedule, focus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, adj, mask)``: features ``(MAX_NODES, NUM_FEATURES)``, adjacency
    ``(MAX_NODES, MAX_NODES)`` with self-loops on real nodes, node mask ``(MAX_NODES,)``."""
    p = sched.program
    x = np.zeros((MAX_NODES, NUM_FEATURES), np.float32)
    adj = np.zeros((MAX_NODES, MAX_NODES), np.float32)
    n = 1  # node 0: the root

    def edge(a: int, b: int) -> None:
        adj[a, b] = adj[b, a] = 1.0

    it0 = 1 + COMP_FEATURES
    for b in range(len(p.branches)):
        stmts = sched.branch_stmts(b)
        levels = sched.stmts[stmts[0]].levels
        parent = 0
        for lvl_idx, lvl in enumerate(levels):
            v = x[n]
            v[it0] = math.log2(_extent(p, stmts[0], lvl) + 1.0) / 16.0
            v[it0 + 1] = lvl.tile / 128.0
            v[it0 + 2] = float(lvl.tile > 0)
            v[it0 + 3] = float(sched.parallel[b] == lvl_idx)
            v[it0 + 4] = sched.unroll[b] / 32.0 if lvl_idx == len(levels) - 1 else 0.0
            v[it0 + 5] = float(b == focus)
            v[it0 + 6] = lvl.shift / 4.0
            v[it0 + 7] = float(_shared(sched, stmts, lvl_idx))
            v[it0 + 8 : it0 + 8 + len(lvl.coeffs)] = np.asarray(lvl.coeffs, np.float32) / 4.0
            edge(parent, n)
            parent = n
            n += 1
        for k in stmts:
            v = x[n]
            v[0] = 1.0
            v[1 : 1 + COMP_FEATURES] = _comp_features(p, k)
            v[COMP_FEATURES] = float(b == focus)  # last computation slot: focus flag
            edge(parent, n)
            n += 1
    mask = np.zeros(MAX_NODES, np.float32)
    mask[:n] = 1.0
    adj[np.arange(n), np.arange(n)] = 1.0
    return x, adj, mask


def flatten(x: np.ndarray, adj: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """One flat float32 observation ``(OBS_SIZE,)``: features, adjacency, node mask."""
    return np.concatenate([x.reshape(-1), adj.reshape(-1), mask]).astype(np.float32)


def unflatten(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of :func:`flatten` (leading batch dims kept)."""
    lead = obs.shape[:-1]
    a = MAX_NODES * NUM_FEATURES
    b = a + MAX_NODES * MAX_NODES
    return (
        obs[..., :a].reshape(*lead, MAX_NODES, NUM_FEATURES),
        obs[..., a:b].reshape(*lead, MAX_NODES, MAX_NODES),
        obs[..., b:],
    )
