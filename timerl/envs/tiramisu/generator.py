"""A seeded generator of random loop nests (the training programs of §4: the paper
trains on generated Tiramisu programs). Every program is drawn from a few templates
(reductions, transposed element-wise maps, out-of-place stencils with a time loop,
two-stage blurs, matmul-like triple loops) with random sizes, loop orders and access
permutations, sized to ~0.5-8 M statement instances. Names are ``gen<seed>_<k>``, so
they never collide with the benchmarks.
"""

from __future__ import annotations

import numpy as np

from timerl.envs.tiramisu.program import Access, Array, Program, Statement

__all__ = ["random_program", "random_programs"]


def _reduction(rng: np.random.Generator, name: str) -> Program:
    n, m = (int(v) for v in rng.choice([1024, 2048, 3072], 2))
    trans = bool(rng.integers(2))
    a_idx = ("j", "i") if trans else ("i", "j")
    shape = (m, n) if trans else (n, m)
    return Program(
        name,
        (Array("A", shape), Array("x", (m,)), Array("y", (n,), True)),
        (
            Statement(
                "S0",
                ("i", "j"),
                f"0 <= i < {n} and 0 <= j < {m}",
                Access("y", ("i",)),
                (Access("y", ("i",)), Access("A", a_idx), Access("x", ("j",))),
                "{0} + {1} * {2}",
                (0, 0, 0),
            ),
        ),
    )


def _elementwise(rng: np.random.Generator, name: str) -> Program:
    if rng.integers(2):
        n, m = (int(v) for v in rng.choice([1024, 2048, 3072], 2))
        its, dom, shape = ("i", "j"), f"0 <= i < {n} and 0 <= j < {m}", (n, m)
        perm = tuple(rng.permutation(2))
    else:
        n = int(rng.choice([128, 160, 192]))
        its, dom, shape = ("i", "j", "k"), f"0 <= i < {n} and 0 <= j < {n} and 0 <= k < {n}", (n, n, n)
        perm = tuple(rng.permutation(3))
    idx = tuple(its[int(k)] for k in perm)
    tshape = tuple(shape[int(k)] for k in perm)
    return Program(
        name,
        (Array("X", tshape), Array("Y", shape), Array("Z", shape, True)),
        (
            Statement(
                "S0",
                its,
                dom,
                Access("Z", its),
                (Access("X", idx), Access("Y", its)),
                "1.5f * {0} + {1} * {1}",
                (0,) * (len(its) + 1),
            ),
        ),
    )


def _stencil(rng: np.random.Generator, name: str) -> Program:
    t = int(rng.choice([4, 8, 12]))
    n = int(rng.choice([256, 384, 512]))
    dom = f"0 <= t < {t} and 1 <= i < {n - 1} and 1 <= j < {n - 1}"
    offs = [("i", "j"), ("i - 1", "j"), ("i + 1", "j"), ("i", "j - 1"), ("i", "j + 1")]
    k = int(rng.integers(3, 6))
    pick = [offs[0]] + [offs[int(v)] for v in rng.choice(np.arange(1, 5), k - 1, replace=False)]
    body = f"{1.0 / k:.4f}f * (" + " + ".join(f"{{{q}}}" for q in range(k)) + ")"
    two = bool(rng.integers(2))
    stmts = [
        Statement(
            "S0",
            ("t", "i", "j"),
            dom,
            Access("B" if two else "A", ("i", "j")),
            tuple(Access("A", o) for o in pick),
            body,
            (0, 0, 0, 0),
        )
    ]
    if two:
        stmts.append(
            Statement(
                "S1",
                ("t", "i", "j"),
                dom,
                Access("A", ("i", "j")),
                tuple(Access("B", o) for o in pick),
                body,
                (0, 1, 0, 0),
            )
        )
    return Program(name, (Array("A", (n, n), True), Array("B", (n, n))), tuple(stmts))


def _blur(rng: np.random.Generator, name: str) -> Program:
    h, w = (int(v) for v in rng.choice([1024, 2048], 2))
    k = int(rng.choice([3, 5]))
    row = tuple(Access("inp", ("i", f"j + {d}")) for d in range(k))
    col = tuple(Access("tmp", (f"i + {d}", "j")) for d in range(k))
    body = "(" + " + ".join(f"{{{q}}}" for q in range(k)) + f") / {k}.0f"
    return Program(
        name,
        (Array("inp", (h + k, w + k)), Array("tmp", (h + k, w)), Array("out", (h, w), True)),
        (
            Statement(
                "S0",
                ("i", "j"),
                f"0 <= i < {h + k} and 0 <= j < {w}",
                Access("tmp", ("i", "j")),
                row,
                body,
                (0, 0, 0),
            ),
            Statement(
                "S1",
                ("i", "j"),
                f"0 <= i < {h} and 0 <= j < {w}",
                Access("out", ("i", "j")),
                col,
                body,
                (1, 0, 0),
            ),
        ),
    )


def _matmul(rng: np.random.Generator, name: str) -> Program:
    n = int(rng.choice([96, 128, 160]))
    order = [("i", "j", "k")[int(v)] for v in rng.permutation(3)]
    dom = " and ".join(f"0 <= {v} < {n}" for v in order)
    return Program(
        name,
        (Array("A", (n, n)), Array("B", (n, n)), Array("C", (n, n), True)),
        (
            Statement(
                "S0",
                tuple(order),
                dom,
                Access("C", ("i", "j")),
                (Access("C", ("i", "j")), Access("A", ("i", "k")), Access("B", ("k", "j"))),
                "{0} + {1} * {2}",
                (0, 0, 0, 0),
            ),
        ),
    )


_TEMPLATES = (_reduction, _elementwise, _stencil, _blur, _matmul)


def random_program(seed: int, k: int = 0) -> Program:
    """Program ``k`` of the stream seeded by ``seed`` (deterministic)."""
    rng = np.random.default_rng([seed, k])
    return _TEMPLATES[int(rng.integers(len(_TEMPLATES)))](rng, f"gen{seed}_{k}")


def random_programs(n: int, seed: int = 0) -> list[Program]:
    """``n`` random programs of the stream ``seed``."""
    return [random_program(seed, k) for k in range(n)]
