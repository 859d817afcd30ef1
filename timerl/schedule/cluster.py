"""Statement clustering before isl scheduling (the scheduling half of TimeRL §5.4 fusion).

isl's scheduler is super-linear in the number of statements, so nodes that can run
together at every point of a shared domain become one statement. :func:`cluster_pdg`
merges nodes with the same domain and condition greedily while the merged statement
stays schedulable in a simple sense:

* every edge between members reads points that run no later under one loop direction
  per dim (lexicographically ``<= 0`` distance, see :mod:`timerl.schedule.distance`),
  and the members that may read each other at the same point form a DAG (their order
  inside the statement);
* every path that leaves the cluster and comes back (through other statements) reads
  strictly earlier points, so the statements in between have room to run. Along the
  dims the cluster lacks, a path keeps the absolute positions it can be at (an edge
  ``w[i, e, m + 1] = new[i, e, m]`` puts ``m >= 1``); a path that must read a position it
  cannot be at (``w[i, 0, 0]`` after that edge) does not exist and is dropped.

Both checks over-approximate distances with intervals, so they may refuse a legal
merge but never accept one that makes a schedulable program unschedulable. Recurrences
running forwards (``x[t - 1]``) and backwards (``x[t + 1]``) never share a cluster, and
n-step learning (reading ``r[t:t + n]``) stays apart from acting, so isl can still
interleave them.

Cost: the path check is a fixpoint over (cluster, distance box) states, run for every
candidate merge, so it is kept from growing with the program (issues 10 and 15). The
answer does not depend on the order states are explored in (as long as no cluster
collects more than ``_MAX_VECS`` boxes, when their hull is taken), which allows:
one step from a cluster in a given state is computed once and reused by later checks
until that cluster changes; loop directions are tried one at a time where no edge can
make a distance lexicographically later on a prefix of dims (there a path already
strictly negative on the prefix is not followed, and only clusters that reach the merge
along edges keeping the prefix at 0 are); a refused merge of the same members is not
checked again (clusters only grow, which only adds paths). These skip only paths that
cannot change the answer, so the merges made are the same as without them.

Postcondition: the cluster PDG has one node per cluster (the representative, its first
member in the member order) carrying every edge that is not an identity edge inside a
cluster; :func:`expand_ast` turns ``Exec(cluster)`` back into member ``Exec``s.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import defaultdict
from dataclasses import replace
from typing import Any

from timerl.pdg.ir import PDG, Edge
from timerl.pdg.ops import OpKind
from timerl.schedule import ast as tast
from timerl.schedule.distance import (
    FULL,
    INF,
    Interval,
    add,
    edge_offsets,
    hull,
    lex_nonpositive,
)
from timerl.symbolic import TRUE, Const, Slice, Sym, index_symbols, substitute

log = logging.getLogger(__name__)

Vec = tuple[Interval, ...]
_CLAMP = 2  # offsets beyond +-_CLAMP widen to infinity, so path analysis terminates
_MAX_VECS = 16  # distinct path distances kept per node before taking their hull


def _clamp(iv: Interval) -> Interval:
    lo, hi = iv
    if lo < -_CLAMP:
        lo = -INF
    elif lo > _CLAMP:
        lo = _CLAMP
    if hi > _CLAMP:
        hi = INF
    elif hi < -_CLAMP:
        hi = -_CLAMP
    return (lo, hi)


def _may_be_zero(vec: Vec) -> bool:
    return all(lo <= 0 <= hi for lo, hi in vec)


def _is_identity(e: Edge, pdg: PDG) -> bool:
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    return (
        e.select is None
        and not e.order_only
        and src.domain == sink.domain
        and src.cond is sink.cond
        and len(e.phi) == len(src.domain)
        and all(c is s for c, s in zip(e.phi, src.domain, strict=True))
    )


class _Clusterer:
    def __init__(self, pdg: PDG) -> None:
        self.pdg = pdg
        self.offs = [edge_offsets(e, pdg) for e in pdg.edges]
        self.out: dict[int, list[int]] = defaultdict(list)
        self.inn: dict[int, list[int]] = defaultdict(list)
        for k, e in enumerate(pdg.edges):
            self.out[e.src].append(k)
            self.inn[e.sink].append(k)
        self.cluster_of = {n: n for n in pdg.nodes}
        self.members: dict[int, list[int]] = {n: [n] for n in pdg.nodes}
        self._aligned_cache: dict[tuple[Sym, ...], list[tuple[_Step, ...]]] = {}
        self._never_forward_cache: dict[Sym, bool] = {}
        # statements refused before: clusters only grow, which adds paths (a path reaching one
        # member reaches all of it) and never removes one, so they stay refused
        self._refused: set[frozenset[int]] = set()
        self._lex_safe_cache: dict[tuple[Sym, ...], dict[tuple[int, ...], int]] = {}
        self.checks = 0  # path analyses run (one per loop direction group tried)
        self.visits = 0  # path states taken off the work stack
        self.walks = 0  # edge steps computed (the rest come from the per-cluster cache)
        self._intra: dict[int, list[tuple[int, Vec]]] = {}  # see :meth:`_intra_of`
        self._signs: dict[int, tuple[tuple[int, ...], ...]] = {}  # see :meth:`_signs_of`
        self._flat_cache: dict[tuple[tuple[Sym, ...], tuple[int, ...]], frozenset[int]] = {}
        # per dims and cluster, state id -> where one step from the cluster in that state
        # leads (see :meth:`_successors`); dropped when the cluster changes
        self._succ_cache: dict[tuple[Sym, ...], dict[int, dict[int, tuple[tuple[int, int], ...]]]] = {}
        self.boxes = _BoxTable()  # the path states seen, as ids
        self._src_of = [e.src for e in pdg.edges]
        self._into_cache: dict[int, list[int]] = {}  # see :meth:`_into`

    def _aligned(self, dims: tuple[Sym, ...]) -> list[tuple[_Step, ...]]:
        """Per edge, how it moves a path's distance along each of ``dims`` (see :func:`_step`),
        then its absolute position along each other dim of the program (:func:`_abs_step`)."""
        got = self._aligned_cache.get(dims)
        if got is None:
            pdg = self.pdg
            extra = [s for s, _ in pdg.dims if _pos(dims, s) < 0]
            got = self._aligned_cache[dims] = [
                tuple(_step(e, pdg, off, d) for d in dims) + tuple(_abs_step(e, pdg, off, x) for x in extra)
                for e, off in zip(pdg.edges, self.offs, strict=True)
            ]
        return got

    def _start(self, dims: tuple[Sym, ...]) -> Vec:
        """A path's state at a cluster member: distance 0, no position along other dims."""
        return tuple((0, 0) for _ in dims) + tuple(FULL for s, _ in self.pdg.dims if _pos(dims, s) < 0)

    def _walk(self, k: int, dims: tuple[Sym, ...], state: Vec) -> Vec | None:
        """A path's state after edge ``k``: distances along ``dims`` (see :meth:`_vec`), then
        absolute positions along the other dims; None when no point of the path can take it."""
        self.walks += 1
        steps = self._aligned(dims)[k]
        n = len(dims)
        out = [_clamp(_move(st, v)) for st, v in zip(steps[:n], state[:n], strict=True)]
        for st, v in zip(steps[n:], state[n:], strict=True):
            pos = _abs_move(st, v)
            if pos is None:
                return None
            out.append(pos)
        return tuple(out)

    def _vec(self, k: int, dims: tuple[Sym, ...]) -> Vec:
        """The distance vector of the lone edge ``k`` along ``dims`` (between two members).

        On a path (:meth:`_walk`), along a dim the current node has, the distance is
        ``start_d - current_d``; along a dim it lacks, it is ``start_d - 0`` (the path left
        the dim reading a known position, and every point it re-enters is at position >= 0).
        """
        steps = self._aligned(dims)[k][: len(dims)]
        return tuple(_clamp(st[1]) if st[0] == "tied" else FULL for st in steps)

    def _successors(self, cl: int, dims: tuple[Sym, ...], vid: int) -> tuple[tuple[int, int], ...]:
        """The (sink node, state id) pairs one edge leads to from cluster ``cl`` (outside the
        merge candidate) in state ``vid`` (an id of :attr:`boxes`), in the order of its
        members and their edges.

        Left out: edges no point can take, edges inside ``cl`` that leave the state as it
        is (they reach a state ``cl`` already has), and a pair whose sink's cluster and
        state a later pair repeats (the later one reaches that state first on the
        work stack of :meth:`_paths_ok`, which makes the earlier one a no-op). Clusters
        only grow, so sinks in one cluster stay in one; the entry is dropped when ``cl``
        changes.
        """
        per = self._succ_cache.setdefault(dims, {}).setdefault(cl, {})
        got = per.get(vid)
        if got is not None:
            return got
        edges, cluster_of, table = self.pdg.edges, self.cluster_of, self.boxes
        vec = table.vecs[vid]
        items: list[tuple[int, int]] = []
        for node in self.members[cl]:
            for k in self.out[node]:
                sink = edges[k].sink
                nv = self._walk(k, dims, vec)
                if nv is None:
                    continue
                nid = table.id(nv)
                if sink != node and nid == vid and cluster_of[sink] == cl:
                    continue
                items.append((sink, nid))
        seen: set[tuple[int, int]] = set()
        kept: list[tuple[int, int]] = []
        for sink, nid in reversed(items):
            tag = (cluster_of[sink], nid)
            if tag not in seen:
                seen.add(tag)
                kept.append((sink, nid))
        got = per[vid] = tuple(reversed(kept))
        return got

    def _paths_ok(self, inside: set[int], dims: tuple[Sym, ...], signs_ok: list[tuple[int, ...]]) -> bool:
        """Whether, for one of the loop directions ``signs_ok``, every path from ``inside``
        back to ``inside`` through other statements reads strictly earlier points.

        Stops at the first path that no direction allows (most refused merges end early).

        A path reaching one member of another cluster reaches all of it at the same point
        (a cluster runs as one statement), so paths are followed between clusters (only
        into clusters from which ``inside`` can be reached again). With
        ``outer_forward`` (the first dim runs upwards) a path that already went strictly
        back along the first dim, which no edge of the program ever reads forwards, stays
        safe whatever follows and is not followed further.
        """
        outer_forward = bool(dims) and all(sg[0] == 1 for sg in signs_ok)
        prune = outer_forward and self._never_forward(dims[0])
        safe = self._lex_safe(dims)
        # The answer is whether some direction allows every path, so the directions can be
        # tried one by one, those along which no edge makes a distance later on the longest
        # prefix of dims first (see :meth:`_lex_safe`), the rest together. For one such
        # direction, a path already strictly negative on the prefix stays so (it is not
        # followed, see :func:`_settled_negative`), so only paths along edges that keep
        # the prefix at 0 (:meth:`_flat`) can return too early: only clusters reaching
        # ``inside`` along those are followed.
        firm = sorted((sg for sg in signs_ok if safe[sg] > 0), key=lambda sg: -safe[sg])
        for sg in firm:
            if self._paths_ok_for(
                inside, dims, [sg], prune, self._reaching(inside, self._flat(dims, sg)), safe
            ):
                return True
        rest = [sg for sg in signs_ok if safe[sg] == 0]
        return bool(rest) and self._paths_ok_for(inside, dims, rest, prune, self._reaching(inside), safe)

    def _paths_ok_for(
        self,
        inside: set[int],
        dims: tuple[Sym, ...],
        viable: list[tuple[int, ...]],
        prune: bool,
        back: set[int],
        safe: dict[tuple[int, ...], int],
    ) -> bool:
        """:meth:`_paths_ok` for the directions ``viable``, ``prune`` and ``back`` given.

        States are ids of :attr:`boxes` (one per distinct box), so the per-cluster box lists,
        the seen set and the step cache hash and compare small ints; the work stack and the
        boxes kept are those of the same walk over the boxes themselves."""
        nd = len(dims)
        table = self.boxes
        vecs = table.vecs
        zero = self._start(dims)
        cluster_of = self.cluster_of
        in_reps = {cluster_of[m] for m in inside}
        states: dict[int, list[int]] = {}  # per cluster, its boxes (state ids)
        # every state ever added to a cluster's boxes: one of its boxes still contains it
        added: set[tuple[int, int]] = set()
        work: list[tuple[int, int]] = []
        for m in inside:
            for k in self.out[m]:
                sink = self.pdg.edges[k].sink
                if sink not in inside and cluster_of[sink] in back:
                    nv = self._walk(k, dims, zero)
                    if nv is not None:
                        work.append((cluster_of[sink], table.id(nv)))
        self.checks += 1
        settled: dict[int, bool] = {}  # per state id, :func:`_settled_negative` under ``viable``
        steps = self._succ_cache.setdefault(dims, {})
        contains = table.contains
        add, push = added.add, work.append
        visits = 0
        try:
            while work:
                item = work.pop()
                visits += 1
                if item in added:
                    continue
                cl, vid = item
                boxes = states.get(cl)
                if boxes is None:
                    states[cl] = boxes = [vid]
                else:  # add the box unless one contains it, dropping the boxes it contains
                    covered = False
                    for w in boxes:
                        if w == vid or contains(w, vid):
                            covered = True
                            break
                    if covered:
                        continue
                    boxes[:] = [w for w in boxes if not contains(vid, w)]
                    boxes.append(vid)
                add(item)
                if len(boxes) > _MAX_VECS:
                    vid = table.hull(boxes)
                    boxes[:] = [vid]
                    added.add((cl, vid))
                if prune and vecs[vid][0][1] < 0:
                    continue
                done = settled.get(vid)
                if done is None:
                    done = settled[vid] = _settled_negative(vecs[vid], viable, safe)
                if done:
                    continue
                per = steps.get(cl)
                nxt = None if per is None else per.get(vid)
                if nxt is None:
                    nxt = self._successors(cl, dims, vid)
                for sink, nid in nxt:
                    scl = cluster_of[sink]
                    if scl in in_reps:
                        narrowed = [sg for sg in viable if lex_nonpositive(vecs[nid][:nd], sg, strict=True)]
                        if not narrowed:
                            return False
                        if len(narrowed) < len(viable):
                            viable = narrowed
                            settled = {}
                    elif scl in back:
                        nitem = (scl, nid)
                        if nitem not in added:  # else skipped when taken off the stack
                            push(nitem)
        finally:
            self.visits += visits
        return True

    def _reaching(self, inside: set[int], edges: frozenset[int] | None = None) -> set[int]:
        """Clusters (outside ``inside``, a union of clusters) from which some path (along
        ``edges`` only, when given) leads into ``inside``: a walk back over the edges into
        each cluster from the others (a path reaching one member reaches all of it)."""
        cluster_of, src_of, into = self.cluster_of, self._src_of, self._into
        start = {cluster_of[m] for m in inside}
        out: set[int] = set()
        stack = list(start)
        while stack:
            cl = stack.pop()
            for k in into(cl):
                if edges is not None and k not in edges:
                    continue
                scl = cluster_of[src_of[k]]
                if scl not in out and scl not in start:
                    out.add(scl)
                    stack.append(scl)
        return out

    def _into(self, cl: int) -> list[int]:
        """The edges into cluster ``cl``'s members from other clusters (kept per cluster; a
        merged cluster's are those of its parts from outside it)."""
        got = self._into_cache.get(cl)
        if got is None:
            cluster_of, src_of = self.cluster_of, self._src_of
            got = [k for m in self.members[cl] for k in self.inn[m] if cluster_of[src_of[k]] != cl]
            self._into_cache[cl] = got
        return got

    def _lex_safe(self, dims: tuple[Sym, ...]) -> dict[tuple[int, ...], int]:
        """Per loop direction ``signs`` over ``dims``: the longest prefix of dims along which
        no edge can make a path's distance lexicographically later.

        An edge moves the top of a path's distance along dim ``j`` (its upper end when
        ``signs[j] = 1``, minus its lower end when ``-1``) by at most ``delta[j]``: the
        offset's end for a read (``tied``), the position's end for a ``drop``, 0 for
        ``none`` and a ``bcast`` upwards, unbounded for a ``bcast`` downwards. Where every
        edge's ``delta`` is lexicographically ``<= 0`` on the prefix, a path whose
        distance is strictly negative (:func:`~timerl.schedule.distance.lex_nonpositive`)
        on it stays so however it goes on (clamping keeps each top's sign).
        """
        got = self._lex_safe_cache.get(dims)
        if got is None:
            nd = len(dims)
            steps = [st[:nd] for st in self._aligned(dims)]
            got = {}
            for signs in itertools.product((1, -1), repeat=nd):
                k = nd
                for st in steps:
                    for j in range(k):
                        x = _top_move(st[j], signs[j])
                        if x < 0:
                            break
                        if x > 0:
                            k = j
                            break
                    if k == 0:
                        break
                got[signs] = k
            self._lex_safe_cache[dims] = got
        return got

    def _flat(self, dims: tuple[Sym, ...], signs: tuple[int, ...]) -> frozenset[int]:
        """The edges that leave the top of a path's distance as it is along the first
        ``self._lex_safe(dims)[signs]`` dims (every other edge makes it strictly negative
        there, see :meth:`_lex_safe`)."""
        key = (dims, signs)
        got = self._flat_cache.get(key)
        if got is None:
            k = self._lex_safe(dims)[signs]
            got = self._flat_cache[key] = frozenset(
                e
                for e, st in enumerate(self._aligned(dims))
                if all(_top_move(st[j], signs[j]) == 0 for j in range(k))
            )
        return got

    def _never_forward(self, d: Sym) -> bool:
        """Whether no edge can make a path's distance along ``d`` later: every offset's upper
        end is <= 0, and every read by a node lacking ``d`` is of position 0 (a read of
        ``x[0:T]`` by a node over no ``t``, read back at every ``t``, returns to every
        ``t``: seed 518000283 merged a recurrence's body with a reader of that node, a
        cycle isl cannot schedule)."""
        got = self._never_forward_cache.get(d)
        if got is None:
            pdg = self.pdg
            got = self._never_forward_cache[d] = all(
                _top_move(_step(e, pdg, off, d), 1) <= 0 for e, off in zip(pdg.edges, self.offs, strict=True)
            )
        return got

    def _intra_of(self, r: int, dims: tuple[Sym, ...]) -> list[tuple[int, Vec]]:
        """(edge, distance) for the edges inside cluster ``r``."""
        got = self._intra.get(r)
        if got is None:  # a single node: its self-edges
            got = self._intra[r] = [
                (k, self._vec(k, dims)) for k in self.out[r] if self.pdg.edges[k].sink == r
            ]
        return got

    def _signs_of(self, r: int, dims: tuple[Sym, ...]) -> tuple[tuple[int, ...], ...]:
        """The loop directions the edges inside cluster ``r`` allow (in a fixed order)."""
        got = self._signs.get(r)
        if got is None:
            edges, intra = self.pdg.edges, self._intra_of(r, dims)
            got = self._signs[r] = tuple(
                signs
                for signs in itertools.product((1, -1), repeat=len(dims))
                if all(lex_nonpositive(v, signs, strict=edges[k].src == edges[k].sink) for k, v in intra)
            )
        return got

    def _cross_edges(self, reps: list[int]) -> list[int]:
        """The edges between two different clusters of ``reps`` (found from all but the largest)."""
        big = max(reps, key=lambda r: len(self.members[r]))
        rset = set(reps)
        edges, cluster_of = self.pdg.edges, self.cluster_of
        out: list[int] = []
        for r in reps:
            if r == big:
                continue
            for m in self.members[r]:
                for k in self.out[m]:
                    c = cluster_of[edges[k].sink]
                    if c != r and c in rset:
                        out.append(k)
                for k in self.inn[m]:
                    if cluster_of[edges[k].src] == big:
                        out.append(k)
        return out

    def try_merge(self, a: int, b: int) -> bool:
        return self.try_merge_many([a, b])

    def try_merge_many(self, nodes: list[int]) -> bool:
        """Merge the clusters of ``nodes`` into one statement if the result stays schedulable."""
        pdg = self.pdg
        reps = list(dict.fromkeys(self.cluster_of[n] for n in nodes))
        if len(reps) < 2:
            return False
        first = pdg.nodes[reps[0]]
        dims = first.domain
        if any(
            not _same_dims(pdg.nodes[r].domain, dims) or pdg.nodes[r].cond is not first.cond for r in reps[1:]
        ):
            return False
        inside = {m for r in reps for m in self.members[r]}
        key = frozenset(inside)
        if key in self._refused:
            return False
        # the edges inside each cluster and the loop directions they allow are kept per
        # cluster; only the edges between the clusters are new
        cross = self._cross_edges(reps)
        intra = [kv for r in reps for kv in self._intra_of(r, dims)]
        intra += [(k, self._vec(k, dims)) for k in cross]
        allowed = [set(self._signs_of(r, dims)) for r in reps[1:]]
        signs_ok = [
            signs
            for signs in self._signs_of(reps[0], dims)
            if all(signs in a for a in allowed)
            and all(lex_nonpositive(self._vec(k, dims), signs, strict=False) for k in cross)
        ]
        if not signs_ok:
            return False
        lazy = frozenset(m for m in inside if pdg.nodes[m].op.kind in LAYOUT_KINDS)
        order = _member_order(inside, [(pdg.edges[k], v) for k, v in intra], lazy)
        if order is None:
            return False
        if not self._paths_ok(inside, dims, signs_ok):
            self._refused.add(key)
            return False
        into = [k for r in reps for k in self._into(r) if self._src_of[k] not in inside]
        for m in inside:
            self.cluster_of[m] = reps[0]
        for r in reps:
            for per_dims in self._succ_cache.values():
                per_dims.pop(r, None)
            self._into_cache.pop(r, None)
            self._intra.pop(r, None)
            self._signs.pop(r, None)
        self._into_cache[reps[0]] = into
        self._intra[reps[0]] = intra
        self._signs[reps[0]] = tuple(signs_ok)
        self.members[reps[0]] = order
        for r in reps[1:]:
            del self.members[r]
        return True


# How an edge moves a path's distance along one dim: ("tied", offset) when both ends have
# the dim; ("drop", position) when only the source has it (the sink reads it at that
# absolute position); ("bcast",) when only the sink has it; ("none",) when neither has it.
_Step = tuple


def _same_dims(a: tuple[Sym, ...], b: tuple[Sym, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _pos(dims: tuple[Sym, ...], d: Sym) -> int:
    """Index of ``d`` in ``dims`` (-1 if absent); symbols are interned, so by identity
    (``==`` on symbols builds a symbolic comparison)."""
    for j, x in enumerate(dims):
        if x is d:
            return j
    return -1


def _step(e: Edge, pdg: PDG, off: dict[Sym, Interval], d: Sym) -> _Step:
    if d in off:
        return ("tied", off[d])
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    j = _pos(src.domain, d)
    if j >= 0:
        return ("drop", _position(e.phi[j]))
    if _pos(sink.domain, d) >= 0:
        return ("bcast",)
    return ("none",)


def _abs_step(e: Edge, pdg: PDG, off: dict[Sym, Interval], x: Sym) -> _Step:
    """How an edge moves a path's absolute position along a dim ``x`` the cluster lacks.

    ("tied", offset, read) when both ends have ``x`` (``read``: the source positions the
    edge can read when its index mentions no dim of the sink, else ``FULL``); ("drop",
    read) when only the source has it; ("bcast", box) when only the sink has it (any
    position of its domain); ("none",) when neither has it.
    """
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    b = pdg.static_bounds.get(pdg.bound_of(x))
    box: Interval = (0, INF if b is None else b - 1)
    j = _pos(src.domain, x)
    if j >= 0:
        read = _read_positions(e.phi[j], pdg, sink.domain)
        if _pos(sink.domain, x) >= 0:
            return ("tied", off[x], read, box)
        return ("drop", read)
    if _pos(sink.domain, x) >= 0:
        return ("bcast", box)
    return ("none",)


def _read_positions(comp: Any, pdg: PDG, sink_dims: tuple[Sym, ...]) -> Interval:
    """Absolute positions an index component reads, ``FULL`` when it depends on the sink's dims."""
    if isinstance(comp, Slice):
        lo, hi = _read_positions(comp.start, pdg, sink_dims), _read_positions(comp.stop, pdg, sink_dims)
        return (lo[0], hi[1] - 1) if lo != FULL and hi != FULL else FULL
    c = substitute(comp, pdg.static_bounds) if pdg.static_bounds else comp
    if isinstance(c, Const):
        return (c.value, c.value)
    if set(index_symbols(c)) & set(sink_dims):
        return FULL
    return (0, INF)


def _abs_move(step: _Step, v: Interval) -> Interval | None:
    """The sink's position range after one edge (see :func:`_abs_step`); None if empty."""
    kind = step[0]
    if kind == "none":
        return v
    if kind == "bcast":
        return step[1]
    read = step[1] if kind == "drop" else step[2]
    if max(v[0], read[0]) > min(v[1], read[1]):
        return None  # the edge reads positions the path cannot be at
    if kind == "drop":
        return FULL
    (olo, ohi), box = step[1], step[3]
    lo = v[0] - ohi if v[0] != -INF or ohi != -INF else -INF
    hi = v[1] - olo if v[1] != INF or olo != INF else INF
    lo, hi = max(lo, box[0]), min(hi, box[1])
    return None if lo > hi else (lo, hi)


def _position(comp: Any) -> Interval:
    """Absolute range of an index component that mentions no dim of the reader (>= 0)."""
    if isinstance(comp, Slice):
        lo, hi = _position(comp.start), _position(comp.stop)
        return (lo[0], hi[1] - 1)
    if isinstance(comp, Const):
        return (comp.value, comp.value)
    return (0, INF)


def _move(step: _Step, v: Interval) -> Interval:
    kind = step[0]
    if kind in ("tied", "drop"):  # drop: start_d - 0 = (start_d - cur_d) + position
        return add(v, step[1])
    if kind == "bcast":  # start_d - r for a re-entered position r >= 0
        return (-INF, v[1])
    return v


def _top_move(step: _Step, sign: int) -> float:
    """How far one edge can raise the top of a path's distance along one dim (see
    :meth:`_Clusterer._lex_safe`)."""
    kind = step[0]
    if kind in ("tied", "drop"):
        return step[1][1] if sign > 0 else -step[1][0]
    if kind == "bcast":
        return 0 if sign > 0 else INF
    return 0


def _settled_negative(vec: Vec, viable: list[tuple[int, ...]], safe: dict[tuple[int, ...], int]) -> bool:
    """Whether every path continuing from ``vec`` returns strictly lexicographically
    negative under every direction in ``viable``: ``vec`` is so already on a prefix of
    dims along which no edge makes a distance later (see :meth:`_Clusterer._lex_safe`)."""
    for signs in viable:
        for j in range(safe[signs]):
            lo, hi = vec[j]
            top = hi if signs[j] > 0 else -lo
            if top < 0:
                break
            if top > 0:
                return False
        else:
            return False
    return True


class _BoxTable:
    """Interned path states: each distinct box gets a small int id (:meth:`id`), and whether
    one box contains another is computed once per pair (:meth:`contains`)."""

    def __init__(self) -> None:
        self.vecs: list[Vec] = []  # id -> box
        self._ids: dict[Vec, int] = {}
        self._contains: dict[tuple[int, int], bool] = {}

    def id(self, v: Vec) -> int:
        """The id of box ``v`` (a new one the first time ``v`` is seen)."""
        got = self._ids.get(v)
        if got is None:
            got = self._ids[v] = len(self.vecs)
            self.vecs.append(v)
        return got

    def contains(self, w: int, v: int) -> bool:
        """Whether box ``w`` contains box ``v`` (every interval of ``v`` within ``w``'s)."""
        key = (w, v)
        got = self._contains.get(key)
        if got is None:
            got = self._contains[key] = all(
                a <= c and d <= b for (a, b), (c, d) in zip(self.vecs[w], self.vecs[v], strict=True)
            )
        return got

    def hull(self, boxes: list[int]) -> int:
        """The id of the smallest box containing every box of ``boxes`` (non-empty)."""
        vecs = self.vecs
        h = vecs[boxes[0]]
        for w in boxes[1:]:
            h = tuple(hull(a, b) for a, b in zip(h, vecs[w], strict=True))
        return self.id(h)


LAYOUT_KINDS = frozenset({OpKind.PERMUTE, OpKind.RESHAPE, OpKind.SQUEEZE, OpKind.UNSQUEEZE, OpKind.EXPAND})
"""Ops that only re-lay out their input: a statement runs each of them just before its first
reader inside the statement (see :func:`_member_order`)."""


def _member_order(
    inside: set[int], intra: list[tuple[Edge, Vec]], lazy: frozenset[int] = frozenset()
) -> list[int] | None:
    """Members in an order that respects every edge that may read the same point; None on a cycle.

    Kahn's algorithm, smallest id first (a deterministic order), except that the members in
    ``lazy`` (layout ops: :data:`LAYOUT_KINDS`) are held back once ready and placed just before
    the first member that reads them (or at the end). A transpose computed early is held
    alongside its input until its reader runs; next to its reader, the runtime compiles both
    into one region and the transpose is never stored (PPO's weight gradients: four
    transposed ``(B * T, 64)`` activations, 131 MB at 512 x 250).
    """
    succs: dict[int, set[int]] = {m: set() for m in inside}
    preds: dict[int, set[int]] = {m: set() for m in inside}
    for e, v in intra:
        if e.src != e.sink and _may_be_zero(v):
            succs[e.src].add(e.sink)
            preds[e.sink].add(e.src)
    indeg = {m: len(preds[m]) for m in inside}
    ready = [m for m in inside if indeg[m] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    held: list[int] = []  # lazy members whose inputs are placed, in the order they got ready
    placed: set[int] = set()

    def place(m: int) -> None:
        for p in sorted(preds[m]):
            if p not in placed and p in lazy:
                place(p)  # a held layout op this member reads: just before it
        placed.add(m)
        out.append(m)

    while ready:
        m = heapq.heappop(ready)
        if m in lazy:
            held.append(m)
        else:
            place(m)
        for x in succs[m]:  # a held member counts as placed for its readers' readiness
            indeg[x] -= 1
            if indeg[x] == 0:
                heapq.heappush(ready, x)
    for m in held:
        if m not in placed:
            place(m)
    return out if len(out) == len(inside) else None


def cluster_pdg(pdg: PDG) -> tuple[PDG, dict[int, list[int]]]:
    """Merge nodes into statements; return (cluster PDG, representative -> members in order)."""
    c = _merge_all(pdg)
    members = {order[0]: order for order in c.members.values()}
    rep = {nid: order[0] for order in members.values() for nid in order}
    edges = []
    for e in pdg.edges:
        a, b = rep[e.src], rep[e.sink]
        if a == b and _is_identity(e, pdg):
            continue
        edges.append(replace(e, src=a, sink=b))
    nodes = {r: pdg.nodes[r] for r in members}
    return pdg.with_(nodes=nodes, edges=tuple(edges)), members


def _merge_all(pdg: PDG) -> _Clusterer:
    """The greedy merges of :func:`cluster_pdg` (the clusterer keeps its work counts)."""
    c = _Clusterer(pdg)
    # Whole groups of nodes linked by data edges within one domain first (one path analysis
    # each; most of them merge), then along data edges one at a time (producer-consumer
    # fusion), then siblings of one domain.
    for group in _linked_groups(pdg):
        if len(group) > 2:
            c.try_merge_many(group)
    # A layout op joins its reader before its producer (see LAYOUT_KINDS): next to its
    # reader the runtime compiles both into one region and the layout op's output is not stored.
    data = [e for e in pdg.edges if e.src != e.sink and not e.order_only]
    layout_first = sorted(data, key=lambda e: pdg.nodes[e.src].op.kind not in LAYOUT_KINDS)
    for e in layout_first:
        c.try_merge(e.src, e.sink)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r in sorted(c.members):
        n = pdg.nodes[r]
        groups[(n.domain, n.cond)].append(r)
    for reps in groups.values():
        for x, y in itertools.combinations(reps, 2):
            c.try_merge(x, y)
    log.debug(
        "clustered %d nodes into %d statements: %d merge checks, %d path states, %d edge steps",
        len(pdg.nodes), len(c.members), c.checks, c.visits, c.walks,
    )  # fmt: skip
    return c


def _linked_groups(pdg: PDG) -> list[list[int]]:
    """Nodes connected by data edges between nodes of one domain and condition."""
    parent = {n: n for n in pdg.nodes}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in pdg.edges:
        if e.src == e.sink or e.order_only:
            continue
        a, b = pdg.nodes[e.src], pdg.nodes[e.sink]
        if a.domain == b.domain and a.cond is b.cond:
            parent[find(e.src)] = find(e.sink)
    groups: dict[int, list[int]] = defaultdict(list)
    for n in sorted(pdg.nodes):
        groups[find(n)].append(n)
    return list(groups.values())


def split_prologue(pdg: PDG) -> tuple[PDG, list[int]]:
    """Pure nodes with an empty domain that read only such nodes (constants and what is
    computed from them alone, e.g. ``1 + a * as_tensor(b)`` with ``b`` vectorized) run once,
    before everything, in dependence order: isl never places them inside a loop (where a
    resumed run, starting that loop at a later iteration, would skip them)."""
    ins: dict[int, list[int]] = {}
    for e in pdg.edges:
        ins.setdefault(e.sink, []).append(e.src)
    pro: list[int] = []
    done: set[int] = set()
    changed = True
    while changed:
        changed = False
        for n in pdg:
            if n.id in done or n.domain or n.op.effectful or n.cond is not TRUE:
                continue
            if all(src in done for src in ins.get(n.id, ())):
                pro.append(n.id)
                done.add(n.id)
                changed = True
    if not pro:
        return pdg, []
    drop = set(pro)
    nodes = {k: v for k, v in pdg.nodes.items() if k not in drop}
    edges = tuple(e for e in pdg.edges if e.src not in drop and e.sink not in drop)
    return pdg.with_(nodes=nodes, edges=edges), pro


def expand_ast(node: tast.AstNode, members: dict[int, list[int]]) -> tast.AstNode:
    """Replace each cluster ``Exec`` by its members' ``Exec``s, in order."""
    if isinstance(node, tast.Exec):
        ms = members.get(node.node, [node.node])
        if len(ms) == 1:
            return node
        return tast.Seq(tuple(tast.Exec(m, node.point) for m in ms))
    if isinstance(node, tast.Seq):
        return tast.Seq(tuple(expand_ast(c, members) for c in node.children))
    if isinstance(node, tast.Loop):
        return replace(node, body=expand_ast(node.body, members))
    if isinstance(node, tast.If):
        return replace(
            node,
            then=expand_ast(node.then, members),
            else_=None if node.else_ is None else expand_ast(node.else_, members),
        )
    return node
