"""Generated C (isl AST -> C, gcc -O3) against a Python run of the program, for the
untransformed and for transformed legal schedules; pragmas where they belong."""

from __future__ import annotations

import numpy as np
import pytest
from tiramisu_brute import run_python

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu import schedule as sc
from timerl.envs.tiramisu.codegen import kernel_c, program_c
from timerl.envs.tiramisu.generator import random_program
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.schedule import initial_schedule


@pytest.fixture(scope="module")
def measurer():
    return Measurer(disk_cache=False, threads=2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: bm.mvt(7),
        lambda: bm.doitgen(2, 3, 4),
        lambda: bm.blur(5, 6),
        lambda: bm.seidel2d(2, 7),
        lambda: bm.heat2d(2, 7),
        lambda: bm.heat3d(2, 5),
        lambda: bm.cvtcolor(4, 5),
    ],
    ids=["mvt", "doitgen", "blur", "seidel2d", "heat2d", "heat3d", "cvtcolor"],
)
def test_untransformed_c_matches_python(make, measurer) -> None:
    p = make()
    np.testing.assert_allclose(measurer.reference(p), run_python(p), rtol=1e-5, atol=1e-5)


def test_transformed_schedules_compute_the_reference(measurer) -> None:
    """Tiling (with partial tiles), skewing + interchange (a wavefront), reversal,
    parallelisation and unrolling: legal schedules give the reference output."""
    p = bm.seidel2d(3, 40)
    s0 = initial_schedule(p)
    legal = LegalityChecker(p)
    wave = sc.interchange(sc.skew(sc.skew(s0, 0, 0), 0, 0), 0, 0)  # (2t + i, t, j): a wavefront
    skewed = sc.tile(sc.skew(sc.skew(s0, 0, 1), 0, 0), 0, 1, 32, 64)
    cands = [wave, skewed, sc.unroll(skewed, 0, 4), sc.skew(s0, 0, 1)]
    assert all(legal(s) for s in cands)
    assert not legal(sc.interchange(s0, 0, 0))  # (i, t, j) breaks the time dependences
    q = bm.jacobi2d(2, 40)
    q0 = initial_schedule(q)
    ql = LegalityChecker(q)
    qs = [
        sc.parallelize(sc.tile(q0, 0, 1, 32, 32), 0, 1),
        sc.reverse(q0, 1, 2),
        sc.interchange(q0, 1, 1),
        sc.unroll(sc.tile(q0, 1, 1, 64, 32), 1, 8),
    ]
    assert all(ql(s) for s in qs)
    for s in cands + qs:
        m = measurer.measure(s)
        assert m.ok, (s.key, m.error)
    ref = run_python(bm.jacobi2d(2, 40))
    np.testing.assert_allclose(measurer.reference(q), ref, rtol=1e-5, atol=1e-5)


def test_pragmas() -> None:
    q = bm.jacobi2d(3, 20)
    s = sc.unroll(sc.parallelize(initial_schedule(q), 0, 1), 1, 4)
    code = kernel_c(s)
    assert code.count("#pragma omp parallel for") == 1
    assert code.count("#pragma GCC unroll 4") == 1
    lines = code.splitlines()
    k = next(i for i, line in enumerate(lines) if "omp parallel" in line)
    assert "for (int c3" in lines[k + 1]  # level 1 = schedule dim 3


def test_wrong_result_is_caught(measurer) -> None:
    """An illegal schedule forced past legality computes a different result, which the
    measurer detects (inf seconds, a reason), without raising."""
    p = bm.seidel2d(3, 30)
    bad = sc.interchange(initial_schedule(p), 0, 0)
    assert not LegalityChecker(p)(bad)
    m = measurer.measure(bad)
    assert not m.ok and "wrong result" in m.error


def test_generated_programs_compile_and_match(measurer) -> None:
    names = set()
    for k in range(6):
        p = random_program(123, k)
        names.add(p.name)
        assert measurer.measure(initial_schedule(p)).ok
    assert len(names) == 6 and all(n.startswith("gen123_") for n in names)
    assert random_program(123, 2) == random_program(123, 2)  # seeded


def test_schedules_with_the_same_code_share_one_measurement(tmp_path) -> None:
    """Tiles larger than the loops give the same C code whatever their sizes: the second
    schedule is neither compiled nor run, also by a new measurer reading the disk cache."""
    p = bm.jacobi2d(3, 24)
    s0 = sc.initial_schedule(p)
    a = sc.tile(sc.tile(s0, 0, 1, 32, 32), 1, 1, 32, 32)
    b = sc.tile(sc.tile(s0, 0, 1, 64, 64), 1, 1, 64, 64)
    assert a.key != b.key and kernel_c(a) == kernel_c(b) != kernel_c(s0)
    m = Measurer(tmp_path, threads=1)
    ta = m.seconds(a)
    compiles, runs = m.compiles, m.runs
    assert m.seconds(b) == ta and (m.compiles, m.runs) == (compiles, runs) and m.source_hits == 1
    m2 = Measurer(tmp_path, threads=1)
    c = sc.tile(sc.tile(s0, 0, 1, 128, 128), 1, 1, 128, 128)
    assert m2.seconds(c) == ta and m2.source_hits == 1
    assert m2.runs == 1  # the reference run of the untransformed program only


def test_added_actions_compute_the_reference(measurer) -> None:
    """Fusion (mvt's nests, blur's stages after a shift), the wavefront skew, and time
    tiling of a two-statement stencil (skew by 2, shift, tiles that split the domain):
    legal schedules whose C output equals a Python run of the untransformed program."""
    cases = []
    p = bm.mvt(7)
    cases.append((p, sc.fuse(sc.interchange(initial_schedule(p), 1, 0), 1, 1)))
    p = bm.blur(5, 6)
    cases.append((p, sc.fuse(sc.shift(sc.shift(initial_schedule(p), 1, 0), 1, 0), 1, 1)))
    cases.append((p, sc.fuse(sc.shift(sc.shift(initial_schedule(p), 1, 0), 1, 0), 1, 0)))
    p = bm.seidel2d(3, 12)
    cases.append((p, sc.unroll(sc.wavefront(initial_schedule(p), 0, 1, 2), 0, 4)))
    p = bm.heat2d(4, 12)
    tt = sc.shift(sc.skew(sc.skew(initial_schedule(p), 0, 0, 2), 1, 0, 2), 1, 1)
    cases.append((p, sc.tile(tt, 0, 0, 2, 5)))
    cases.append((p, sc.tile(sc.fuse(tt, 1, 2), 0, 0, 3, 4)))
    p = bm.heat3d(3, 6)
    cases.append(
        (p, sc.tile(sc.shift(sc.skew(sc.skew(initial_schedule(p), 0, 0, 2), 1, 0, 2), 1, 1), 0, 0, 2, 3))
    )
    for p, s in cases:
        assert s is not None and LegalityChecker(p)(s), s.key
        m = measurer.measure(s)
        assert m.ok, (s.key, m.error)
        np.testing.assert_allclose(measurer.reference(p), run_python(p), rtol=1e-5, atol=1e-5)
    p = bm.heat2d(4, 12)  # without the shift: illegal, and the code it would give is wrong
    bad = sc.tile(sc.skew(sc.skew(initial_schedule(p), 0, 0, 2), 1, 0, 2), 0, 0, 2, 5)
    assert not LegalityChecker(p)(bad) and not measurer.measure(bad).ok
    fused = kernel_c(cases[0][1])
    assert fused.count("for (") == 2 and "S0(c1, c3);" in fused and "S1(c3, c1);" in fused  # one nest


def test_cpu_clock_with_one_thread() -> None:
    """One thread: the harness times CPU time (load-proof), in its own cache file; the
    default wall clock elsewhere."""
    p = bm.jacobi2d(2, 20)
    s = sc.unroll(initial_schedule(p), 0, 4)
    m1 = Measurer(disk_cache=False, threads=1)
    assert m1.cpu_clock and "CLOCK_PROCESS_CPUTIME_ID" in program_c(s, initial_schedule(p), m1.clock)
    assert m1._db.name == "measurements-1t-cpu.jsonl"
    assert m1.measure(s).ok and m1.base_seconds(p) > 0
    m2 = Measurer(disk_cache=False, threads=2)
    assert not m2.cpu_clock and "CLOCK_MONOTONIC" in program_c(s, initial_schedule(p), m2.clock)
