"""A deterministic GFLOPS estimate of a LoopTune state, **for CI tests only**.

It lets the env, the searches and the agents be tested without timing anything. Its
numbers are not measurements: constructing it outside pytest logs a warning.

The model (a nominal core at 3 GHz doing 32 float32 flop/cycle, :attr:`AnalyticCostModel.peak`
= 96 GFLOPS) adds three costs in cycles:

- **compute**: ``flops / 32`` divided by a vector efficiency (innermost loop over the
  kernel's vector dim, ``n`` for matmul: ``min(1, lanes / 16)``; over another output dim
  such as ``m``: 1/16, gathers; over a reduction dim such as ``k``: 1/48, a scalar
  reduction chain) and by a register efficiency (1 when the loops under the innermost
  reduction loop keep at most 256 floats of ``T`` in registers, else 1/2: ``T`` is loaded
  and stored around every FMA), plus 2 cycles per run of the innermost loop and 10 %
  when a compute loop has a tail (predicated iterations);
- **memory**: for L1 (32 KiB, filled at 32 B/cycle) and L2 (1 MiB, 12 B/cycle), the
  outermost loop whose subtree's footprint fits decides the traffic: each tensor's
  footprint there, times the trip counts of the loops outside it (LRU, no reuse
  across a loop whose subtree overflows the cache);
- **write-back and init**: ``T`` streamed once or twice, 4x slower when the write-back's
  innermost loop is not the vector dim (strided).

Footprints come from the kernel's index expressions (``X[i+r, c]`` over a subtree
spanning ``i`` and ``r`` touches ``span(i) + span(r) - 1`` rows).

Compute and memory overlap: ``max + 0.2 * min``.

:meth:`AnalyticCostModel.for_host` sets the vector width and the register budget from this
CPU's vector extension (AVX2: 8 lanes, 16 registers; AVX-512: 16 lanes, 32 registers):
the accumulator tile under the innermost reduction loop must fit the registers left after
the operands (3/4 of them), else it spills. It is the ranking that
:mod:`timerl.envs.looptune.seed_demos` uses to pick the schedules it measures for the
agent's demonstrations; it never rewards the agent.
"""

from __future__ import annotations

import logging
import math
import os

from timerl.envs.looptune.ir import LoopState, Nest, steps
from timerl.envs.looptune.kernels import Kernel

log = logging.getLogger("timerl.envs.looptune")

_FREQ = 3e9
_FLOP_PER_CYCLE = 32.0
_LANES = 16
_CACHES = ((32 * 1024, 32.0), (1024 * 1024, 12.0))  # (bytes, fill bytes/cycle)


class AnalyticCostModel:
    """Deterministic GFLOPS estimate (see the module doc); a :class:`Measurer`."""

    name = "analytic"
    peak = _FREQ * _FLOP_PER_CYCLE / 1e9

    def __init__(
        self, lanes: int = _LANES, register_floats: int = 256, unroll_vectors: int = 0, warn: bool = True
    ) -> None:
        self.lanes = int(lanes)
        self.unroll_vectors = int(unroll_vectors)
        self.register_floats = int(register_floats)
        self._mem: dict[str, float] = {}
        if warn and "PYTEST_CURRENT_TEST" not in os.environ:
            log.warning(
                "LoopTune: AnalyticCostModel is a stand-in for CI tests; its GFLOPS are estimates, "
                "not measurements. Use measurer='tvm' for real results."
            )

    @classmethod
    def for_host(cls) -> AnalyticCostModel:
        """The model with this CPU's vector lanes and register budget (a ranking, no warning)."""
        lanes, registers = host_vector_isa()
        return cls(
            lanes=lanes, register_floats=registers * lanes * 3 // 4, unroll_vectors=registers, warn=False
        )

    def gflops(self, state: LoopState) -> float:
        key = state.schedule_key
        if key not in self._mem:
            cycles = _compute_cycles(
                state, self.lanes, self.register_floats, self.unroll_vectors
            ) + _writeback_cycles(state)
            self._mem[key] = state.problem.flops / (cycles / _FREQ) / 1e9
        return self._mem[key]


def host_vector_isa() -> tuple[int, int]:
    """``(float32 lanes, vector registers)`` of this CPU: ``(16, 32)`` with AVX-512F, else
    ``(8, 16)`` (AVX2; also the guess where ``/proc/cpuinfo`` cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return (16, 32) if "avx512f" in flags else (8, 16)


def _compute_cycles(
    state: LoopState, lanes_per_vector: int = _LANES, register_floats: int = 256, unroll_vectors: int = 0
) -> float:
    idx = [i for i, lp in enumerate(state.loops) if lp.nest is Nest.COMPUTE]
    loops = [state.loops[i] for i in idx]
    st = [steps(state)[i] for i in idx]
    span = [lp.size * s + lp.tail for lp, s in zip(loops, st, strict=True)]  # elements covered
    trips = [sp / s for sp, s in zip(span, st, strict=True)]
    kern = state.problem.kernel
    inner = loops[-1]
    lanes = inner.size + (1 if inner.tail else 0)
    if inner.dim == kern.vector_dim:
        vec = min(1.0, lanes / lanes_per_vector)
    else:
        vec = 1.0 / lanes_per_vector if inner.dim in kern.out_dims else 1.0 / 48
    last_k = max(i for i, lp in enumerate(loops) if lp.dim in kern.reduction_dims)
    tile = _footprint(kern, loops, span, last_k + 1, (2,)) // 4 if last_k + 1 < len(loops) else 1 << 30
    reg = 1.0 if tile <= register_floats else 0.5
    flops = state.problem.flops
    compute = flops / _FLOP_PER_CYCLE / (vec * reg)
    # loop overhead: 2 cycles per run of the innermost loop that is not unrolled (with
    # ``unroll_vectors``, inner loops whose body stays within that many vector ops are)
    rolled, body = len(loops) - 1, max(1.0, lanes / lanes_per_vector)
    while unroll_vectors and rolled > 0 and body * trips[rolled - 1] <= unroll_vectors:
        rolled -= 1
        body *= trips[rolled]
    outer_runs = 1.0
    for t in trips[:rolled]:
        outer_runs *= t
    compute += 2.0 * outer_runs
    if any(lp.tail for lp in loops):
        compute *= 1.1
    memory = 0.0
    for cap, bw in _CACHES:
        level = len(loops) - 1
        while level > 0 and _footprint(kern, loops, span, level - 1, (0, 1, 2)) <= cap:
            level -= 1
        mult = 1.0
        for t in trips[:level]:
            mult *= t
        memory += _footprint(kern, loops, span, level, (0, 1, 2)) * mult / bw
    return max(compute, memory) + 0.2 * min(compute, memory)


def _footprint(kern: Kernel, loops: list, span: list[int], level: int, tensors: tuple[int, ...]) -> int:
    """Bytes of ``tensors`` (indices into :attr:`.Kernel.accesses`: lhs, rhs, accumulator)
    touched by one run of the loops ``level..`` (a subtree)."""
    ext: dict[str, int] = {}
    for lp, sp in zip(loops[level:], span[level:], strict=True):
        ext.setdefault(lp.dim, sp)  # the outermost loop of a dim in the subtree spans it
    total = 0
    for i in tensors:
        acc = kern.accesses[i]
        total += 4 * math.prod(acc.shape({d: ext.get(d, 1) for d in acc.dims}))
    return total


def _writeback_cycles(state: LoopState) -> float:
    p = state.problem
    write = state.nest_loops(Nest.WRITE)
    bw = 16.0 if write[-1].dim == p.kernel.vector_dim else 4.0
    size = math.prod(p.extent(d) for d in p.kernel.out_dims)
    return 8.0 * size / bw + 4.0 * size / 16.0
