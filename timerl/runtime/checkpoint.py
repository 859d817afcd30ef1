"""Checkpoint and resume of a running program, at iteration boundaries of the outer dim.

**What is saved.** The state at the end of iteration ``k`` of the iteration dim ``i`` (the
outermost dim of the program that nodes vary over, static bound) is exactly the set of
values read across the ``i`` boundary, found from the PDG (:func:`carried_values`): the
source points of every *data* edge whose sink reads the source at an earlier ``i`` than
its own (``w[i] <- w_new[i - 1]``: params, Adam moments, any user recurrence over ``i``),
or whose sink has no ``i`` (a final read after the loop). Order-only edges carry no data
and are skipped. For a source read at ``i - d`` the points with ``k - d < i <= k`` are
saved; for any other read of an earlier iteration (a slice over ``i``) every stored point
with ``i <= k``. Dynamic bounds found so far (``T`` per episode) are saved too.

**Files.** ``<dir>/ckpt_<k>.npz`` holds one array per saved point, keyed
``<value name>@<point>``; a value is named by its source node's name, else by the name of
the node reading it (``'dnn.w0'``, ``'dnn.w0.adam_m'``) — with ``.next`` when that reader
is carried under its own name too (``w[i + 1, 0] = new[i, K - 1]`` beside a read of ``w[i - 1]``:
``'dnn.w0'`` and ``'dnn.w0.next'``) — else ``%<node id>.<output>``.
``<dir>/ckpt_<k>.json`` holds the iteration, the fingerprint (per carried value: name,
per-point shape, dtype, batch; the static bounds other than the iteration bound; the
seed) and a config (compile options and the user's ``config=``).
``<dir>/ckpt_<k>.envs.pkl`` holds the environments' own states (:func:`env_states`: a
gymnasium vector env pickled, a gymnax state as host arrays), so fixed-length rollouts,
whose episodes continue across iterations, resume where they were; an env without
``snapshot()`` (brax, the loop-optimisation envs, Ray runners) is not saved, and a resumed
run that steps it before a reset fails saying so (:class:`~timerl.errors.EnvNotResetError`).

**Resume.** :func:`load_checkpoint` picks the file (the latest ``ckpt_<k>`` of a
directory, or the given file), checks the fingerprint against the program being
compiled (:class:`~timerl.errors.TimeRLError` naming every difference; nothing is
written), and :class:`CheckpointingExecutor` puts the saved points into the store before
running and starts the loop over ``i`` at ``k + 1`` (the plan, ``make_plan(resume_after=k)``). RNG ops and
env resets are seeded per point and env states restored, so a resumed run is bit-identical
to an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.errors import EnvNotResetError, RuntimeExecutionError, TimeRLError
from timerl.pdg.ir import PDG
from timerl.pdg.ops import OpKind
from timerl.plan.iterations import carried_values, checkpoint_sinks, iteration_dim
from timerl.plan.plan import Plan
from timerl.runtime.interpreter import Executor as _Interpreter
from timerl.runtime.store import Point
from timerl.schedule.ast import AstNode, Exec, Loop
from timerl.symbolic import Sym, free_symbols
from timerl.symbolic.compile import compile_expr

log = logging.getLogger(__name__)

FORMAT = "timerl-checkpoint/1"
_CKPT = re.compile(r"^ckpt_(\d+)\.json$")


def fingerprint(pdg: PDG, i: Sym, seed: int) -> dict[str, Any]:
    bound = pdg.bound_of(i)
    return {
        "dim": i.name,
        "carried": {c.name: c.spec() for c in carried_values(pdg, i)},
        "bounds": {
            s.name: int(v)
            for s, v in sorted(pdg.static_bounds.items(), key=lambda x: x[0].name)
            if s is not bound
        },
        "seed": int(seed),
    }


def _differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    out = []
    if saved.get("dim") != now["dim"]:
        out.append(f"iteration dim: {saved.get('dim')!r} in the checkpoint, {now['dim']!r} in this program")
    sc, nc = saved.get("carried", {}), now["carried"]
    for k in sorted(set(sc) - set(nc)):
        out.append(f"carried value {k!r} is in the checkpoint but not in this program")
    for k in sorted(set(nc) - set(sc)):
        out.append(f"carried value {k!r} of this program is not in the checkpoint")
    for k in sorted(set(sc) & set(nc)):
        for f in ("shape", "dtype", "batch"):
            if sc[k].get(f) != nc[k][f]:
                out.append(f"{k!r}: {f} {sc[k].get(f)} in the checkpoint, {nc[k][f]} in this program")
    sb, nb = saved.get("bounds", {}), now["bounds"]
    for k in sorted(set(sb) | set(nb)):
        if sb.get(k) != nb.get(k):
            out.append(f"bound {k}: {sb.get(k)} in the checkpoint, {nb.get(k)} in this program")
    if saved.get("seed") != now["seed"]:
        out.append(f"seed: {saved.get('seed')} in the checkpoint, {now['seed']} in this program")
    return out


# -- loading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint: the iteration it ends, the saved points and dynamic bounds."""

    path: str
    iteration: int
    values: dict[tuple[int, int, Point], np.ndarray]  # (nid, oid, point) -> value
    dynamic: dict[str, dict[Point, int]]
    envs: dict[str, Any] | None = None  # env states by label (env_states), None where not saved


def pick_checkpoint(path: str) -> str:
    """The JSON file of ``path``: a ``ckpt_<k>.json``/``.npz`` file or the latest in a directory."""
    if not path:
        raise TimeRLError("resume: empty checkpoint path")
    if os.path.isdir(path):
        found = [(int(m.group(1)), f) for f in os.listdir(path) if (m := _CKPT.match(f))]
        if not found:
            raise TimeRLError(f"resume: no checkpoint (ckpt_<i>.json) in directory {path!r}")
        return os.path.join(path, max(found)[1])
    if path.endswith(".npz"):
        path = path[: -len(".npz")] + ".json"
    if not os.path.isfile(path):
        raise TimeRLError(f"resume: checkpoint {path!r} does not exist")
    return path


def read_values(path: str) -> dict[str, dict[Point, np.ndarray]]:
    """The values a checkpoint holds (``path``: a file or a directory, its latest), by the
    saved value's name (e.g. ``dnn.w0``) and point. Reads only; raises ``TimeRLError``."""
    jpath = pick_checkpoint(path)
    npath = jpath[: -len(".json")] + ".npz"
    if not os.path.isfile(npath):
        raise TimeRLError(f"resume: checkpoint values {npath!r} are missing")
    out: dict[str, dict[Point, np.ndarray]] = {}
    try:
        with np.load(npath, allow_pickle=False) as z:
            for key in z.files:
                name, _, pt = key.rpartition("@")
                point = tuple(int(x) for x in pt.split(",")) if pt else ()
                out.setdefault(name, {})[point] = z[key]
    except (OSError, ValueError) as exc:
        raise TimeRLError(f"resume: cannot read checkpoint values {npath!r}: {exc}") from exc
    return out


def load_checkpoint(path: str, pdg: PDG, seed: int) -> Checkpoint:
    """Read and check a checkpoint against ``pdg`` (reads only; raises ``TimeRLError``)."""
    jpath = pick_checkpoint(path)
    npath = jpath[: -len(".json")] + ".npz"
    try:
        with open(jpath) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise TimeRLError(f"resume: cannot read checkpoint {jpath!r}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TimeRLError(f"resume: {jpath!r} is not a timerl checkpoint (format {FORMAT!r})")
    i = iteration_dim(pdg)
    if i is None:
        raise TimeRLError("resume: this program has no iteration dim (no dim with a static bound)")
    now = fingerprint(pdg, i, seed)
    diffs = _differences(meta.get("fingerprint", {}), now)
    if diffs:
        raise TimeRLError(
            f"resume: checkpoint {jpath!r} does not match this program:\n  " + "\n  ".join(diffs)
        )
    k = int(meta["iteration"])
    by_name = {c.name: c for c in carried_values(pdg, i)}
    values: dict[tuple[int, int, Point], np.ndarray] = {}
    for name, by_point in read_values(jpath).items():
        c = by_name.get(name)
        if c is None:
            raise TimeRLError(f"resume: {npath!r} holds {name!r}, not a carried value of this program")
        for point, v in by_point.items():
            values[(c.nid, c.oid, point)] = v
    have = {(nid, oid) for nid, oid, _ in values}
    absent = [c.name for c in by_name.values() if (c.nid, c.oid) not in have]
    if absent and k >= 0:
        raise TimeRLError(f"resume: {npath!r} has no values for {absent}")
    dynamic = {
        name: {tuple(key): int(v) for key, v in entries}
        for name, entries in meta.get("dynamic_bounds", {}).items()
    }
    envs = None
    if meta.get("env_states"):
        epath = jpath[: -len(".json")] + ".envs.pkl"
        try:
            with open(epath, "rb") as f:
                envs = pickle.load(f)  # the user's own checkpoint, as torch.load reads one
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
            raise TimeRLError(f"resume: cannot read the environments' states {epath!r}: {exc}") from exc
    return Checkpoint(jpath, k, values, dynamic, envs)


def env_states(pdg: PDG) -> dict[str, Any]:
    """The environments whose state a checkpoint saves (objects with ``snapshot()`` and
    ``restore()`` behind the program's UDFs: gymnasium and gymnax envs), by a label stable
    across compiles of the same program (``<order>:<env id>``, in node order)."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for nid in sorted(pdg.nodes):
        n = pdg.nodes[nid]
        if n.op.kind is not OpKind.UDF:
            continue
        st = getattr(n.op.attr("fn"), "state", None)
        if st is None or id(st) in seen or not hasattr(st, "snapshot") or not hasattr(st, "restore"):
            continue
        seen.add(id(st))
        out[f"{len(out)}:{getattr(st, 'env_id', type(st).__name__)}"] = st
    return out


# -- the executor ---------------------------------------------------------------------------------


def _env_not_reset(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an exception it was raised from is an :class:`EnvNotResetError`."""
    while exc is not None:
        if isinstance(exc, EnvNotResetError):
            return True
        exc = exc.__cause__
    return False


class CheckpointingExecutor(_Interpreter):
    """The interpreter, plus: checkpoint requests served at the end of iterations, resume."""

    def __init__(
        self,
        plan: Plan,
        backend: Any,
        seed: int = 0,
        resume: Checkpoint | None = None,
        config: dict[str, Any] | None = None,
        memory_timeline: bool = False,
    ) -> None:
        pdg = plan.pdg
        self.iter_dim = plan.iter_dim
        self.config = dict(config or {})
        self.resume_from = resume
        self._sinks = checkpoint_sinks(pdg)
        self._bodies: dict[int, tuple[Sym, int]] = {}
        i = self.iter_dim
        if (self._sinks or resume is not None) and i is None:
            raise TimeRLError(
                "checkpoint/resume: this program has no iteration dim (no dim with a static bound)"
            )
        if resume is not None and plan.resume_after != resume.iteration:
            raise TimeRLError(
                f"resume: the plan skips iterations up to {plan.resume_after}, the checkpoint "
                f"{resume.path} ends at {resume.iteration}: make the plan with resume_after={resume.iteration}"
            )
        self._plain: tuple[Loop, int] | None = None
        if i is not None:
            if self._sinks and plan.iter_loop is not None:
                self._plain = (plan.iter_loop, plan.iter_offset)
                self._bodies[id(plan.iter_loop.body)] = (plan.iter_loop.var, plan.iter_offset)
            self._carried = carried_values(pdg, i)
        super().__init__(plan, backend, seed=seed, memory_timeline=memory_timeline)
        run = self._run

        def run_resumed() -> None:
            for s in self._sinks:
                s.requests.clear()
            if self.resume_from is not None:
                self._restore(self.resume_from)
            try:
                run()
            except RuntimeExecutionError as exc:
                if self.resume_from is not None and _env_not_reset(exc):
                    raise EnvNotResetError(
                        f"{exc}\nresumed from {self.resume_from.path}: the program steps an "
                        "environment whose episodes continue across iterations (e.g. fixed-length "
                        "rollouts: the next iteration starts from the last step's observation) and "
                        "checkpoints hold the program's values, not the environment's own state; "
                        "resume programs that reset their environments every iteration (episodic "
                        "rollouts), or start this run anew"
                    ) from exc
                raise
            self._serve_final()

        self._run = run_resumed

    def _compile(self, node: AstNode, scope: frozenset[Sym]) -> Callable[[], None]:
        fn = super()._compile(node, scope)
        i, ck = self.iter_dim, self.resume_from
        if ck is not None and isinstance(node, Exec) and i in self.pdg.nodes[node.node].domain:
            comp = node.point[self.pdg.nodes[node.node].domain.index(i)]
            if free_symbols(comp) & set(self._dyn):
                raise TimeRLError(
                    f"resume: the schedule runs %{node.node} at {i.name} = {comp}, a dynamic bound"
                )
            at, k, env_ = compile_expr(comp), ck.iteration, self._env
            inner = fn

            def guarded() -> None:  # points of finished iterations never run again
                if at(env_) > k:
                    inner()

            return guarded
        return fn

    def _compile_body(self, loop: Loop, scope: frozenset[Sym]) -> Callable[[], None]:
        fn = super()._compile_body(loop, scope)
        hit = self._bodies.get(id(loop.body))
        if hit is None:
            return fn
        var, c = hit
        env = self._env
        compiled = self._iteration

        def run_body() -> None:
            fn()
            if compiled is not None and compiled.ran:  # its sinks run as the call runs
                compiled.wait()
            if any(s.requests for s in self._sinks):
                if compiled is not None:
                    compiled.flush()  # the store as the last call left it
                self._serve(env[var] + c)

        return run_body

    # -- writing -------------------------------------------------------------------------------
    def _serve_final(self) -> None:
        """At the end of a run: the last iteration's state is complete whatever the schedule."""
        i = self.iter_dim
        if i is None or not any(s.requests for s in self._sinks):
            return
        last = int(self._static[self.pdg.bound_of(i)]) - 1
        paths: dict[str, dict[str, Any]] = {}
        for s in self._sinks:
            if any(r.get(i.name, last) == last for r in s.requests):
                paths.setdefault(s.path, {}).update(s.config)
            others = sorted({r[i.name] for r in s.requests if r.get(i.name, last) != last})
            if others:
                log.warning(
                    "checkpoint %s at %s = %s not written: the schedule interleaves iterations "
                    "(no plain loop over %s); only the last iteration's state can be saved",
                    s.path,
                    i.name,
                    others,
                    i.name,
                )
            s.requests.clear()
        for path, cfg in paths.items():
            self.write_checkpoint(path, last, cfg)

    def _serve(self, k: int) -> None:
        paths: dict[str, dict[str, Any]] = {}
        for s in self._sinks:
            if s.requests:
                paths.setdefault(s.path, {}).update(s.config)
                s.requests.clear()
        for path, cfg in paths.items():
            self.write_checkpoint(path, k, cfg)

    def write_checkpoint(self, path: str, k: int, config: dict[str, Any] | None = None) -> str:
        """Write the state at the end of iteration ``k`` into ``path``; returns the JSON path."""
        i = self.iter_dim
        assert i is not None
        arrays: dict[str, np.ndarray] = {}
        for c in self._carried:
            idx = self.pdg.nodes[c.nid].domain.index(i)
            for p in self.store.points(c.nid, c.oid):
                if p[idx] <= k and (c.lag is None or p[idx] > k - c.lag):
                    x = self.store.get(c.nid, c.oid, p)
                    arrays[f"{c.name}@{','.join(map(str, p))}"] = np.array(self.backend.to_numpy(x))
        meta = {
            "format": FORMAT,
            "iteration": int(k),
            "fingerprint": fingerprint(self.pdg, i, self.seed),
            "config": {**self.config, **(config or {})},
            "dynamic_bounds": {
                db.sym.name: [[list(key), int(v)] for key, v in sorted(db.known.items())]
                for db in self._dyn.values()
            },
        }
        envs = {label: st.snapshot() for label, st in env_states(self.pdg).items()}
        meta["env_states"] = sorted(envs)
        os.makedirs(path or ".", exist_ok=True)
        base = os.path.join(path, f"ckpt_{k}")
        with open(base + ".npz.tmp", "wb") as f:
            np.savez(f, **arrays)
        os.replace(base + ".npz.tmp", base + ".npz")
        if envs:
            with open(base + ".envs.pkl.tmp", "wb") as f:
                pickle.dump(envs, f)
            os.replace(base + ".envs.pkl.tmp", base + ".envs.pkl")
        with open(base + ".json.tmp", "w") as f:
            json.dump(meta, f, indent=1, default=str)
        os.replace(base + ".json.tmp", base + ".json")
        return base + ".json"

    # -- resuming ------------------------------------------------------------------------------
    def _restore(self, ck: Checkpoint) -> None:
        be = self.backend
        if ck.envs is not None:
            for label, st in env_states(self.pdg).items():
                if label not in ck.envs:
                    raise TimeRLError(
                        f"resume: {ck.path} holds no state for env {label!r} "
                        f"(it holds {sorted(ck.envs) or 'none'})"
                    )
                st.restore(ck.envs[label])
        for (nid, oid, point), a in ck.values.items():
            self.store.put(nid, oid, point, be.from_numpy(np.asarray(a)))
        by_name = {db.sym.name: db for db in self._dyn.values()}
        for name, known in ck.dynamic.items():
            db = by_name.get(name)
            if db is None:
                continue
            db.known.update(known)
            if known:
                db.key = max(known)
