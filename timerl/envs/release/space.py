"""Layers and their knob spaces (the design spaces of RELEASE's Table 1, for a CPU).

A :class:`Layer` is a conv2d at batch 1 (NCHW, the input given already padded) or a matmul.
Its loops are the output dims (``f, y, x`` / ``i, j``) and the reduction dims
(``rc, ry, rx`` / ``k``). The template (:mod:`.template`) tiles every loop once, so each
loop has a **tile knob** (the inner extent: a divisor of the loop's extent, at most
:data:`MAX_TILE`), and the template adds the unroll knobs of Table 1
(``auto_unroll_max_step``, ``unroll_explicit``) and two CPU knobs (``vectorize`` the
innermost output loop, ``parallel`` the outermost one). A configuration is a tuple of
indices, one per knob, into the knob's ordered values; RELEASE's actions move each index
by -1, 0 or +1.

One constraint is part of the template, as AutoTVM's templates have them: the register
tile (the product of the output tile knobs, the block the template accumulates in a
local buffer) holds at most ``max_tile_elems`` elements. A space in which no
configuration satisfies it raises :class:`~timerl.errors.TimeRLError` when it is built.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from timerl.errors import TimeRLError

MAX_TILE = 64
UNROLL_STEPS = (0, 8, 32, 128)
DEFAULT_MAX_TILE_ELEMS = 1024
FEATURE_KINDS = ("knob", "itervar")
ITERVAR_PER_LOOP = 10  # features per loop of the nest in KnobSpace.loop_features

Config = tuple[int, ...]


class LayerKind(enum.Enum):
    CONV2D = "conv2d"
    MATMUL = "matmul"


@dataclass(frozen=True)
class Layer:
    """A conv2d (``out[f, y, x] = sum data[rc, y*s + ry, x*s + rx] * w[f, rc, ry, rx]``,
    ``data`` padded) or a matmul (``C[i, j] = sum A[i, k] * B[k, j]``)."""

    name: str
    kind: LayerKind
    sizes: tuple[int, ...]  # conv2d: (C_in, C_out, H, kernel, stride, pad); matmul: (M, N, K)

    @staticmethod
    def conv2d(name: str, c_in: int, c_out: int, size: int, kernel: int, stride: int, pad: int) -> Layer:
        return Layer(name, LayerKind.CONV2D, (c_in, c_out, size, kernel, stride, pad))

    @staticmethod
    def matmul(name: str, m: int, n: int, k: int) -> Layer:
        return Layer(name, LayerKind.MATMUL, (m, n, k))

    @property
    def out_size(self) -> int:
        """Conv2d: the output's height (= width)."""
        _, _, h, kh, s, p = self.sizes
        return (h + 2 * p - kh) // s + 1

    @property
    def loops(self) -> tuple[tuple[str, int], ...]:
        """``(name, extent)`` of the output loops, then the reduction loops."""
        if self.kind is LayerKind.MATMUL:
            m, n, k = self.sizes
            return (("i", m), ("j", n), ("k", k))
        c_in, c_out, _, kh, _, _ = self.sizes
        o = self.out_size
        return (("f", c_out), ("y", o), ("x", o), ("rc", c_in), ("ry", kh), ("rx", kh))

    @property
    def num_spatial(self) -> int:
        return 2 if self.kind is LayerKind.MATMUL else 3

    @property
    def flops(self) -> int:
        return 2 * math.prod(e for _, e in self.loops)

    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Shapes of the two inputs and of the output (conv2d: the padded input)."""
        if self.kind is LayerKind.MATMUL:
            m, n, k = self.sizes
            return (m, k), (k, n), (m, n)
        c_in, c_out, h, kh, _, p = self.sizes
        o = self.out_size
        return (c_in, h + 2 * p, h + 2 * p), (c_out, c_in, kh, kh), (c_out, o, o)

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The float64 NumPy result of the layer on inputs ``a``, ``b``."""
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if self.kind is LayerKind.MATMUL:
            return a64 @ b64
        _, _, _, kh, s, _ = self.sizes
        win = np.lib.stride_tricks.sliding_window_view(a64, (kh, kh), axis=(1, 2))[:, ::s, ::s]
        return np.einsum("cyxij,fcij->fyx", win, b64, optimize=True)


# ResNet-18's conv layers at batch 1 (He et al., 2016; the workloads AutoTVM tunes), and a matmul.
RESNET18_LAYERS: dict[str, Layer] = {
    "C2": Layer.conv2d("C2", 64, 64, 56, 3, 1, 1),
    "C4": Layer.conv2d("C4", 64, 128, 56, 1, 2, 0),
    "C6": Layer.conv2d("C6", 128, 128, 28, 3, 1, 1),
    "C7": Layer.conv2d("C7", 128, 256, 28, 1, 2, 0),
    "C9": Layer.conv2d("C9", 256, 256, 14, 3, 1, 1),
    "C10": Layer.conv2d("C10", 256, 512, 14, 1, 2, 0),
    "C12": Layer.conv2d("C12", 512, 512, 7, 3, 1, 1),
}
MATMUL_LAYERS: dict[str, Layer] = {
    "MM256": Layer.matmul("MM256", 256, 256, 256),
    "MM64": Layer.matmul("MM64", 64, 64, 64),  # small: smoke tests
}
LAYERS: dict[str, Layer] = {**RESNET18_LAYERS, **MATMUL_LAYERS}


def layer(name: str) -> Layer:
    """A layer of :data:`LAYERS` by name."""
    if name not in LAYERS:
        raise TimeRLError(f"unknown RELEASE layer {name!r}; known: {', '.join(LAYERS)}")
    return LAYERS[name]


@dataclass(frozen=True)
class Knob:
    """One dimension of the design space: a name and its ordered values."""

    name: str
    values: tuple[int, ...]


def divisors(n: int, cap: int = MAX_TILE) -> tuple[int, ...]:
    return tuple(d for d in range(1, min(n, cap) + 1) if n % d == 0)


@dataclass(frozen=True)
class KnobSpace:
    """The knobs of one layer's template (see the module doc)."""

    layer: Layer
    knobs: tuple[Knob, ...]
    max_tile_elems: int = DEFAULT_MAX_TILE_ELEMS

    def __post_init__(self) -> None:
        for k in self.knobs:
            if not k.values:
                raise TimeRLError(
                    f"RELEASE space of {self.layer.name}: knob {k.name} has no value, so the space has no "
                    "configuration; give every knob at least one value"
                )
        if not self._any_valid():
            raise TimeRLError(
                f"RELEASE space of {self.layer.name}: no configuration has a register tile of at most "
                f"{self.max_tile_elems} elements (the smallest output tiles multiply to "
                f"{self._min_tile()}); raise max_tile_elems or allow smaller tile knobs"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(k.values) for k in self.knobs)

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def values(self, cfg: Config) -> dict[str, int]:
        """The knob values of ``cfg`` by knob name."""
        return {k.name: k.values[i] for k, i in zip(self.knobs, cfg, strict=True)}

    def describe(self, cfg: Config) -> str:
        """``cfg`` as ``name=value`` pairs (``name=#index`` where an index is out of range)."""
        parts = []
        for k, i in zip(self.knobs, cfg, strict=False):
            parts.append(f"{k.name}={k.values[i]}" if 0 <= i < len(k.values) else f"{k.name}=#{i}")
        return ", ".join(parts)

    def _spatial_knobs(self) -> list[int]:
        return list(range(self.layer.num_spatial))

    def _min_tile(self) -> int:
        return math.prod(min(self.knobs[i].values) for i in self._spatial_knobs())

    def _any_valid(self) -> bool:
        return self._min_tile() <= self.max_tile_elems

    def tile_elems(self, cfg: Config) -> int:
        return math.prod(self.knobs[i].values[cfg[i]] for i in self._spatial_knobs())

    def is_valid(self, cfg: Config) -> bool:
        """In range for every knob and within the register-tile constraint."""
        if len(cfg) != len(self.knobs) or any(not 0 <= c < n for c, n in zip(cfg, self.sizes, strict=True)):
            return False
        return self.tile_elems(cfg) <= self.max_tile_elems

    def random(self, rng: np.random.Generator) -> Config:
        """A uniformly random valid configuration (rejection sampling)."""
        for _ in range(10_000):
            cfg = tuple(int(rng.integers(n)) for n in self.sizes)
            if self.is_valid(cfg):
                return cfg
        # a tight constraint: pick the spatial tiles among the valid combinations
        spatial = self._spatial_knobs()
        combos = [
            c
            for c in itertools.product(*(range(self.sizes[i]) for i in spatial))
            if math.prod(self.knobs[i].values[j] for i, j in zip(spatial, c, strict=True))
            <= self.max_tile_elems
        ]
        pick = combos[int(rng.integers(len(combos)))]
        rest = [int(rng.integers(n)) for n in self.sizes]
        for i, j in zip(spatial, pick, strict=True):
            rest[i] = j
        return tuple(rest)

    def move(self, cfg: Config, directions: Sequence[int]) -> Config:
        """``cfg`` with each index moved by its direction (-1, 0, +1), clipped to the knob's
        range; an invalid result leaves ``cfg`` unchanged (RELEASE's configuration updater)."""
        nxt = tuple(
            min(max(c + int(d), 0), n - 1) for c, d, n in zip(cfg, directions, self.sizes, strict=True)
        )
        return nxt if self.is_valid(nxt) else cfg

    def neighbour(self, cfg: Config, rng: np.random.Generator) -> Config:
        """AutoTVM's random walk: one knob set to another random value (valid results only)."""
        for _ in range(100):
            k = int(rng.integers(len(self.knobs)))
            if self.sizes[k] < 2:
                continue
            v = int(rng.integers(self.sizes[k] - 1))
            new = list(cfg)
            new[k] = v if v < cfg[k] else v + 1
            if self.is_valid(tuple(new)):
                return tuple(new)
        return cfg

    def neighbourhood(self, cfg: Config, changes: int = 2) -> list[Config]:
        """Every valid configuration that differs from ``cfg`` in 1 to ``changes`` knobs (any
        values of those knobs), in a fixed order: by the knobs changed, then by their values."""
        out: list[Config] = []
        for r in range(1, changes + 1):
            for knobs in itertools.combinations(range(len(self.knobs)), r):
                others = [[v for v in range(self.sizes[k]) if v != cfg[k]] for k in knobs]
                for vals in itertools.product(*others):
                    new = list(cfg)
                    for k, v in zip(knobs, vals, strict=True):
                        new[k] = v
                    if self.is_valid(tuple(new)):
                        out.append(tuple(new))
        return out

    def tile_steps(self, cfg: Config, changes: int) -> list[Config]:
        """Every valid configuration that moves exactly ``changes`` tile knobs of ``cfg`` (the
        knobs named ``tile_*``) by one index each, up or down, the other knobs kept; in a fixed
        order: by the knobs moved, then by the directions (-1 before +1)."""
        tiles = [k for k, knob in enumerate(self.knobs) if knob.name.startswith("tile_")]
        out: list[Config] = []
        for knobs in itertools.combinations(tiles, changes):
            for dirs in itertools.product((-1, 1), repeat=changes):
                new = list(cfg)
                for k, d in zip(knobs, dirs, strict=True):
                    new[k] += d
                if self.is_valid(tuple(new)):
                    out.append(tuple(new))
        return out

    def normalised(self, cfgs: Sequence[Config]) -> np.ndarray:
        """Each index over its knob's last index, in [0, 1]: ``(len(cfgs), num_knobs)`` float32
        (RELEASE's state, and the space k-means clusters in)."""
        den = np.maximum(np.array(self.sizes, np.float32) - 1.0, 1.0)
        return np.asarray(cfgs, np.float32).reshape(len(cfgs), len(self.knobs)) / den

    def _values(self, cfgs: Sequence[Config]) -> np.ndarray:
        vals = np.array([[k.values[i] for k, i in zip(self.knobs, c, strict=True)] for c in cfgs], np.float64)
        return vals.reshape(len(cfgs), len(self.knobs))

    def features(self, cfgs: Sequence[Config], kind: str = "knob") -> np.ndarray:
        """Cost-model features, ``float32``. ``kind="knob"``: log2 of every knob value (plus
        one), the log2 register tile, reduction tile and outer trip count,
        ``(len(cfgs), num_knobs + 3)``. ``kind="itervar"``: those, then
        :meth:`loop_features` (``ITERVAR_PER_LOOP`` per loop of the template's nest),
        ``(len(cfgs), num_knobs + 3 + ITERVAR_PER_LOOP * 2 * len(layer.loops))``."""
        if kind not in FEATURE_KINDS:
            raise TimeRLError(f"RELEASE features: kind must be one of {FEATURE_KINDS}, got {kind!r}")
        vals = self._values(cfgs)
        logs = np.log2(vals + 1.0)
        ns, nl = self.layer.num_spatial, len(self.layer.loops)
        extents = np.array([e for _, e in self.layer.loops], np.float64)
        tile = np.log2(vals[:, :ns]).sum(1, keepdims=True)
        red = np.log2(vals[:, ns:nl]).sum(1, keepdims=True)
        outer = np.log2(extents[:ns] / vals[:, :ns]).sum(1, keepdims=True)
        parts = [logs, tile, red, outer]
        if kind == "itervar":
            parts.append(self.loop_features(cfgs))
        return np.concatenate(parts, 1).astype(np.float32)

    def loop_features(self, cfgs: Sequence[Config]) -> np.ndarray:
        """AutoTVM-style "itervar" features of the template's loop nest (:mod:`.template`'s
        order: outer output loops, outer reduction loops, inner reduction loops, inner output
        loops), computed from the knobs without building: per loop, outermost first, the
        log2 (plus one) of its extent, of the iterations of the nest from it inward, of each
        buffer's footprint (distinct elements touched) in one iteration of it and of that
        buffer's reuse (iterations over footprint) -- buffers in the order output, first
        input (conv2d: the padded data; matmul: ``A``), second input (weights / ``B``) -- and
        two annotations: the vector lanes of the loop (the innermost output loop's tile when
        ``vectorize`` is on, else 1) and whether it is parallel. ``(len(cfgs),
        ITERVAR_PER_LOOP * 2 * len(layer.loops))`` float64, deterministic."""
        lay = self.layer
        vals = self._values(cfgs)
        n, ns, nl = len(vals), lay.num_spatial, len(lay.loops)
        extents = np.array([e for _, e in lay.loops], np.float64)
        tiles = vals[:, :nl]
        # the nest, outermost first: (loop index, extent per configuration)
        order = list(range(ns)) + list(range(ns, nl))
        nest = [(d, extents[d] / tiles[:, d]) for d in order] + [(d, tiles[:, d]) for d in range(ns, nl)]
        nest += [(d, tiles[:, d]) for d in range(ns)]
        iv, ip = self.names.index("vectorize"), self.names.index("parallel")
        lanes = np.where(vals[:, iv] > 0, tiles[:, ns - 1], 1.0)
        span = np.ones((n, nl))  # per loop dim: the extent covered from the current level inward
        work = np.ones(n)
        feats = []
        for level in range(len(nest) - 1, -1, -1):  # inside out
            d, ext = nest[level]
            span[:, d] *= ext
            work = work * ext
            fps = self._footprints(span)
            f = [ext, work]
            for fp in fps:
                f += [fp, work / fp]
            f = [np.log2(x + 1.0) for x in f]
            f.append(lanes if level == len(nest) - 1 else np.ones(n))
            f.append(vals[:, ip] if level == 0 else np.zeros(n))
            feats.append(np.stack(f, 1))
        return np.concatenate(feats[::-1], 1)

    def _footprints(self, span: np.ndarray) -> list[np.ndarray]:
        """Distinct elements of the output, the first and the second input touched when every
        loop dim covers ``span[:, d]`` consecutive iterations."""
        if self.layer.kind is LayerKind.MATMUL:
            i, j, k = span.T
            return [i * j, i * k, k * j]
        f, y, x, rc, ry, rx = span.T
        s = self.layer.sizes[4]
        return [f * y * x, rc * ((y - 1) * s + ry) * ((x - 1) * s + rx), f * rc * ry * rx]


def template_space(layer: Layer, max_tile_elems: int = DEFAULT_MAX_TILE_ELEMS) -> KnobSpace:
    """The knob space of ``layer``'s template: a tile knob per loop, then
    ``auto_unroll_max_step``, ``unroll_explicit``, ``vectorize`` and ``parallel``."""
    knobs = [Knob(f"tile_{name}", divisors(extent)) for name, extent in layer.loops]
    knobs += [
        Knob("auto_unroll_max_step", UNROLL_STEPS),
        Knob("unroll_explicit", (0, 1)),
        Knob("vectorize", (0, 1)),
        Knob("parallel", (0, 1)),
    ]
    return KnobSpace(layer, tuple(knobs), max_tile_elems)
