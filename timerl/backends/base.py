"""The backend interface and the batch rules shared by every backend.

A backend executes one PDG op at a time (:meth:`AbstractBackend.run`) on its own tensor
type, plus a few layout helpers the runtime needs (stack, concat, take, ...).

**Batch semantics.** Vectorization turns symbolic dims into leading concrete dims. A node
with batch shape ``batch`` (possibly ``()``) receives inputs of which some carry those
leading dims (``batched[k]``) and some do not. The op's per-point semantics (see
:class:`timerl.pdg.ops.OpKind`) is applied independently at every batch index, unbatched
inputs being shared by all batch indices. The output always carries the batch dims when
``batch != ()``. Concretely:

- elementwise ops right-align per-point shapes: a batched input whose per-point rank is
  below the largest per-point rank gets singleton axes right after its batch dims;
- per-point ``dim``/``dims`` attributes are shifted by ``len(batch)`` on batched inputs;
- when no input is batched, the kernel runs per point and :meth:`run` broadcasts the
  result over ``batch`` (random ops instead draw ``batch + shape`` independent samples).

Each final backend supplies ``kernels``: a table from :class:`OpKind` to a
:data:`Kernel`. The adapters below (``unary``, ``elementwise``, ``reduction``, ...) wrap a
native function with the batch rules so each table entry stays one line.

Values are treated as immutable: kernels never write into their inputs, and callers must
not write into outputs (they may alias inputs, e.g. ``IDENTITY`` or DLPack imports).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from timerl.errors import BackendError
from timerl.pdg.ops import DType, Op, OpKind
from timerl.symbolic import Expr, Sym, evaluate

# Op kinds the runtime executes itself; a backend refuses them.
RUNTIME_OPS = frozenset({OpKind.MERGE, OpKind.SET_SYMBOL, OpKind.UDF, OpKind.SINK, OpKind.EVAL_SYMBOL})
# Op kinds whose kernel produces the batch dims itself (independent samples per index).
BATCH_NATIVE_OPS = frozenset({OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL})


def _batch_native(op: Op) -> bool:
    """Whether ``op``'s result already carries the batch dims (a ``CONST`` with
    ``batched=True`` holds one value per batch index, e.g. a vectorized ``as_tensor(b)``)."""
    return op.kind in BATCH_NATIVE_OPS or (op.kind is OpKind.CONST and bool(op.attr("batched", False)))


@dataclass(frozen=True, slots=True)
class KernelCall:
    """One execution of an op: its attributes, batch shape and the symbol values."""

    op: Op
    batch: tuple[int, ...]
    batched: tuple[bool, ...]
    env: Mapping[Sym, int]

    @property
    def any_batched(self) -> bool:
        return any(self.batched)

    def attr(self, name: str, default: Any = ...) -> Any:
        return self.op.attr(name, default)

    def int_attr(self, name: str) -> int:
        """An integer attribute, evaluating a symbolic expression at this point."""
        return eval_int(self.op.attr(name), self.env)

    def shape_attr(self, name: str) -> tuple[int, ...]:
        """A shape attribute whose entries may be symbolic expressions."""
        return tuple(eval_int(s, self.env) for s in self.op.attr(name))

    def dtype_attr(self, name: str = "dtype") -> DType:
        dt = self.op.attr(name)
        if not isinstance(dt, DType):
            raise BackendError(f"{self.op!r}: attribute {name!r} must be a DType, got {dt!r}")
        return dt

    def offset(self, k: int) -> int:
        """How many leading batch dims input ``k`` carries."""
        return len(self.batch) if self.batched[k] else 0


def eval_int(v: Any, env: Mapping[Sym, int]) -> int:
    """Evaluate an int-or-Expr attribute entry."""
    if isinstance(v, Expr):
        return int(evaluate(v, env))
    return int(v)


# A kernel: (backend, call, inputs) -> output.
Kernel = Callable[["AbstractBackend", KernelCall, Sequence[Any]], Any]


class AbstractBackend(abc.ABC):
    """A tensor library that runs PDG ops. Subclasses are final (``JaxBackend``, ``TorchBackend``)."""

    name: ClassVar[str]
    kernels: ClassVar[Mapping[OpKind, Kernel]]
    static_shapes: ClassVar[bool] = False
    donates: ClassVar[bool] = False
    scans: ClassVar[str] = ""
    """How a static loop of traceable statements runs as one call (``runtime/scan.py``):
    ``"compiled"`` (one ``lax.scan`` in one compiled function), ``"host"`` (one Python loop
    over the statements' prepared kernels, no store work per iteration), or ``""`` (not)."""
    """Whether :meth:`compile` honours ``donate`` (compiled regions write into donated buffers)."""
    """Whether every new input shape costs a compilation (the runtime then pads slice reads
    of zero-padding-safe reductions to power-of-two lengths, see ``runtime.interpreter``)."""

    def __init__(self) -> None:
        # CONST values converted once per Op object; the Op is kept alive next to its id.
        self._const_cache: dict[int, tuple[Op, Any]] = {}

    # -- RNG and conversion ------------------------------------------------------------
    @abc.abstractmethod
    def seed(self, seed: int) -> None:
        """Reset the RNG state used by ``RAND_*`` ops."""

    def random_points(self, seeds: Sequence[int], shape: tuple[int, ...], dtype: DType, normal: bool) -> Any:
        """``len(seeds)`` draws stacked on a new leading axis; row ``k`` equals one ``RAND_*``
        of ``shape`` after ``seed(seeds[k])`` (a RAND node vectorized over a dim keeps the values
        it has per point). This default draws them one by one."""
        op = Op.make(OpKind.RAND_NORMAL if normal else OpKind.RAND_UNIFORM, shape=shape, dtype=dtype)
        rows = []
        for s in seeds:
            self.seed(int(s))
            rows.append(self.run(op, [], (), (), {}))
        return self.stack(rows, 0)

    @abc.abstractmethod
    def from_numpy(self, a: np.ndarray) -> Any:
        """Copy a NumPy array into a backend tensor, keeping its dtype."""

    def compile_seconds(self) -> float:
        """Seconds this process has spent compiling programs for this backend so far (0 where
        it compiles nothing)."""
        return 0.0

    def from_numpy_all(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """:meth:`from_numpy` of each array (a UDF's outputs); a backend may batch them."""
        return [self.from_numpy(a) for a in arrays]

    @abc.abstractmethod
    def to_numpy(self, x: Any) -> np.ndarray:
        """A NumPy view or copy of ``x`` (treat it as read-only)."""

    # -- op execution --------------------------------------------------------------------
    def run(
        self,
        op: Op,
        inputs: Sequence[Any],
        batch: tuple[int, ...],
        batched: Sequence[bool],
        env: Mapping[Sym, int],
    ) -> Any:
        """Run ``op`` on ``inputs`` and return its one output (see the module doc for batching).

        **Arguments:** ``batch``: the node's leading batch shape, ``()`` if none;
        ``batched[k]``: whether ``inputs[k]`` carries those leading dims; ``env``: values
        of the symbols appearing in the op's attributes.
        """
        if len(inputs) != len(batched):
            raise BackendError(f"{op!r}: got {len(inputs)} inputs but {len(batched)} batched flags")
        return self.prepare(op, batch, batched, env)(inputs)

    def prepare(
        self, op: Op, batch: tuple[int, ...], batched: Sequence[bool], env: Mapping[Sym, int]
    ) -> Callable[[Sequence[Any]], Any]:
        """:meth:`run` with everything but the inputs bound: the kernel looked up and its
        call built once (a fused region calls each member's this way, with no per-call checks
        but the kernel's own)."""
        kernel = self.kernels.get(op.kind)
        if kernel is None:
            if op.kind in RUNTIME_OPS:
                raise BackendError(
                    f"{op!r} is executed by the runtime, not by a backend; "
                    f"the runtime must handle {op.kind.name} before calling {self.name} backend's run()"
                )
            raise BackendError(f"the {self.name} backend has no kernel for {op.kind.name} ({op!r})")
        batch = tuple(int(b) for b in batch)
        flags = tuple(bool(b) for b in batched) if batch else (False,) * len(batched)
        call = KernelCall(op, batch, flags, env)
        widen = bool(batch) and not call.any_batched and not _batch_native(op)
        bind = getattr(kernel, "bind", None)
        bound = bind(call) if bind is not None else functools.partial(kernel, self, call)

        def invoke(inputs: Sequence[Any]) -> Any:
            try:
                out = bound(inputs)
            except BackendError:
                raise
            except Exception as e:  # wrap native errors with the op and shapes involved
                shapes = [tuple(x.shape) for x in inputs]
                raise BackendError(
                    f"{self.name} kernel for {op!r} failed on input shapes {shapes} "
                    f"(batch={batch}, batched={list(flags)}): {type(e).__name__}: {e}"
                ) from e
            return self.broadcast_batch(out, batch) if widen else out

        return invoke

    def const_value(self, op: Op) -> Any:
        """The ``CONST`` op's value as a backend tensor, converted once per op."""
        hit = self._const_cache.get(id(op))
        if hit is None:
            hit = (op, self.from_numpy(np.asarray(op.attr("value"))))
            self._const_cache[id(op)] = hit
        return hit[1]

    # -- layout helpers used by the runtime ---------------------------------------------
    @abc.abstractmethod
    def stack(self, xs: Sequence[Any], axis: int) -> Any:
        """Stack tensors of equal shape along a new ``axis``."""

    def restack(self, rows: Any, start: int, stop: int, axis: int) -> Any:
        """``stack([row k of rows for k in range(start, stop)], axis)`` from rows already
        stacked on ``axis`` (what a scanned loop leaves, see ``runtime/scan.py``): the rows
        themselves when the range is all of them, else that range along ``axis``."""
        if (start, stop) == (0, rows.shape[axis]):
            return rows
        return rows[(slice(None),) * axis + (slice(start, stop),)]

    def restack_padded(self, rows: Any, start: int, stop: int, axis: int, size: int) -> Any:
        """:meth:`restack`, then zero-padded along ``axis`` to ``size >= stop - start`` rows
        (what :meth:`stack_padded` of those rows gives)."""
        out = self.restack(rows, start, stop, axis)
        if size == stop - start:
            return out
        shape = tuple(out.shape)
        pad = self.zeros(shape[:axis] + (size - (stop - start),) + shape[axis + 1 :], DType.float32)
        return self.concat([out, self.cast_like(pad, out)], axis)

    def unstack(self, rows: Any, axis: int = 0) -> list[Any]:
        """The rows of ``rows`` along ``axis``, one array each (the inverse of ``stack(xs, axis)``)."""
        return [self.take(rows, axis, k) for k in range(rows.shape[axis])]

    def stack_padded(self, xs: Sequence[Any], axis: int, size: int) -> Any:
        """Stack along a new ``axis``, then zero-pad that axis to ``size >= len(xs)``."""
        out = self.stack(xs, axis)
        if size == len(xs):
            return out
        shape = tuple(out.shape)
        pad = self.zeros(shape[:axis] + (size - len(xs),) + shape[axis + 1 :], DType.float32)
        return self.concat([out, self.cast_like(pad, out)], axis)

    @abc.abstractmethod
    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        """Concatenate tensors along an existing ``axis``."""

    @abc.abstractmethod
    def take(self, x: Any, axis: int, index: int) -> Any:
        """Select element ``index`` along ``axis`` (the axis is removed)."""

    @abc.abstractmethod
    def mask_rows(self, x: Any, axis: int, stop: int) -> Any:
        """``x`` with the rows ``stop ..`` along ``axis`` set to zero (same shape)."""

    @abc.abstractmethod
    def permute_axes(self, x: Any, perm: tuple[int, ...]) -> Any:
        """Axes of ``x`` reordered: axis ``k`` of the result is axis ``perm[k]`` of ``x``."""

    @abc.abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype: DType) -> Any:
        """A zero tensor."""

    @abc.abstractmethod
    def cast_like(self, x: Any, like: Any) -> Any:
        """``x`` converted to the dtype of ``like``."""

    @abc.abstractmethod
    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        """NumPy ``broadcast_to`` (may return a view)."""

    def broadcast_batch(self, x: Any, batch: tuple[int, ...]) -> Any:
        """Prepend ``batch`` dims by broadcasting: shape ``s`` -> ``batch + s``."""
        return self.broadcast_to(x, tuple(batch) + tuple(x.shape))

    @abc.abstractmethod
    def any_true(self, x: Any) -> bool:
        """Whether any element is true."""

    @abc.abstractmethod
    def all_true(self, x: Any) -> bool:
        """Whether every element is true."""

    # -- block buffers (the runtime's block store, ``runtime/block_store.py``) ------------
    # A block buffer holds consecutive points of one tensor along one dim: row ``k`` of a
    # buffer of shape ``(rows,) + value shape`` is the value at the ``k``-th coordinate the
    # buffer covers. The block store writes each row once (it copies a buffer before
    # writing a row again), so rows and row ranges handed out earlier may alias the buffer.
    @abc.abstractmethod
    def block_alloc(self, rows: int, like: Any) -> Any:
        """A zero buffer of shape ``(rows,) + like.shape`` with ``like``'s dtype."""

    @abc.abstractmethod
    def block_copy(self, buf: Any) -> Any:
        """A copy of ``buf`` (``buf`` itself is unchanged)."""

    @abc.abstractmethod
    def block_write(self, buf: Any, index: int, x: Any) -> Any:
        """Write ``x`` (shape and dtype of a row) into row ``index``; returns the buffer to use
        from now on. In place where the library allows it; ``buf`` must not be used again."""

    def block_write_rows(self, buf: Any, dst: int, xs: Any, axis: int, src: int, count: int) -> Any:
        """Write rows ``src .. src + count - 1`` of ``xs`` along ``axis`` into rows ``dst ..``
        of ``buf`` (as :meth:`block_write` of each); returns the buffer to use from now on."""
        for j in range(count):
            buf = self.block_write(buf, dst + j, self.take(xs, axis, src + j))
        return buf

    @abc.abstractmethod
    def block_row(self, buf: Any, index: int) -> Any:
        """Row ``index`` (a view where the library has views)."""

    @abc.abstractmethod
    def block_rows(self, pieces: Sequence[tuple[Any, int, int]], axis: int, size: int) -> Any:
        """Rows ``buf[start:stop]`` of each ``(buf, start, stop)`` piece, concatenated, with the
        row axis moved to ``axis`` and zero-padded along it to ``size`` rows: what
        ``stack_padded`` of the rows gives (same values, shape and layout)."""

    # -- interop and compilation -------------------------------------------------------
    @abc.abstractmethod
    def to_dlpack(self, x: Any) -> Any:
        """An object exporting ``x`` through ``__dlpack__`` (pass it to another backend's ``from_dlpack``)."""

    @abc.abstractmethod
    def from_dlpack(self, obj: Any) -> Any:
        """Import an object supporting ``__dlpack__`` without copying where the library allows."""

    def run_into(
        self,
        op: Op,
        inputs: Sequence[Any],
        batch: tuple[int, ...],
        batched: Sequence[bool],
        env: Mapping[Sym, int],
        out: Any,
    ) -> Any | None:
        """:meth:`run` writing the result into ``out`` (a donated buffer of the result's shape
        and dtype that nothing else references) and returning it, or None where the backend
        cannot (the caller then runs :meth:`run`). Only for backends whose compiled regions
        do not donate by themselves (Torch); the default cannot."""
        return None

    @abc.abstractmethod
    def compile(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        """Compile a function of backend tensors (for fused regions). ``donate``: positions
        of arguments whose buffers the compiled function may reuse for its outputs (the
        caller holds no other reference to them; a backend may ignore it)."""

    @abc.abstractmethod
    def nbytes(self, x: Any) -> int:
        """Bytes used by the elements of ``x``."""

    # -- swapping (schedule/swap.py) ---------------------------------------------------
    def to_host(self, x: Any) -> Any:
        """A host copy of ``x`` sharing no memory with it (an offload: the caller then drops
        ``x``). Default: a NumPy copy through :meth:`to_numpy`."""
        return np.array(self.to_numpy(x), copy=True)

    def from_host(self, h: Any) -> Any:
        """A backend tensor holding the host copy ``h`` (a fetch). Default: :meth:`from_numpy`."""
        return self.from_numpy(h)

    def host_nbytes(self, h: Any) -> int:
        """Bytes held by a host copy made by :meth:`to_host`."""
        return int(h.nbytes)


# ---------------------------------------------------------------------------------------
# Adapters: native function -> Kernel with the batch rules applied.
# ---------------------------------------------------------------------------------------


def unary(fn: Callable[[Any], Any]) -> Kernel:
    """A unary elementwise op (batch dims need no care)."""
    return lambda be, c, xs: fn(xs[0])


def align_ranks(c: KernelCall, xs: Sequence[Any], trailing: Sequence[int] | None = None) -> list[Any]:
    """Right-align per-point shapes of batched inputs: insert singleton axes after the batch dims.

    ``trailing[k]`` per-point dims at the end of input ``k`` are kept out of the alignment
    (e.g. the gathered axis); only the per-point dims before them are aligned.
    """
    if not c.any_batched:
        return list(xs)
    tr = list(trailing) if trailing is not None else [0] * len(xs)
    nb = len(c.batch)
    lead = [x.ndim - c.offset(k) - tr[k] for k, x in enumerate(xs)]
    m = max(lead)
    out = []
    for k, x in enumerate(xs):
        if c.batched[k] and lead[k] < m:
            s = tuple(x.shape)
            x = x.reshape(s[:nb] + (1,) * (m - lead[k]) + s[nb:])
        out.append(x)
    return out


def elementwise(fn: Callable[..., Any]) -> Kernel:
    """An n-ary elementwise op with NumPy broadcasting of the per-point shapes (its ``bind``:
    the same for one call site, :meth:`AbstractBackend.prepare`)."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        return fn(*align_ranks(c, xs))

    kernel.bind = lambda c: _bound_elementwise(fn, c)  # type: ignore[attr-defined]
    return kernel


def _bound_elementwise(fn: Callable[..., Any], c: KernelCall) -> Callable[[Sequence[Any]], Any]:
    """``fn`` on one call site's inputs, their rank alignment (:func:`align_ranks`) worked out
    once per input ranks: where it changes nothing, later calls of those ranks pass the inputs
    straight on. A prepared ``ADD`` on Torch, (8, 64) + (64,): 9.1 -> 4.9 us per call (the
    library call alone: 3.9); PPO's acting loop calls 7 of them per step."""
    if not c.any_batched:
        return lambda xs: fn(*xs)
    plain: set[tuple[int, ...]] = set()

    def call(xs: Sequence[Any]) -> Any:
        ranks = tuple(x.ndim for x in xs)
        if ranks in plain:
            return fn(*xs)
        aligned = align_ranks(c, xs)
        if all(a is x for a, x in zip(aligned, xs, strict=True)):
            plain.add(ranks)
        return fn(*aligned)

    return call


def reduction(fn: Callable[[Any, tuple[int, ...], bool], Any]) -> Kernel:
    """``fn(x, axes, keepdim)`` with per-point ``dims`` shifted past the batch dims."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        dims = c.attr("dims")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        o = c.offset(0)
        return fn(xs[0], tuple(d + o for d in dims), bool(c.attr("keepdim", False)))

    return kernel


def along_dim(fn: Callable[[Any, int], Any]) -> Kernel:
    """``fn(x, axis)`` with the per-point ``dim`` attribute shifted past the batch dims."""
    return lambda be, c, xs: fn(xs[0], c.int_attr("dim") + c.offset(0))


def _index_kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
    x = xs[0]
    ax = c.int_attr("dim") + c.offset(0)
    i = c.int_attr("index")
    n = x.shape[ax]
    if not -n <= i < n:
        raise BackendError(f"{c.op!r}: index {i} out of range for per-point dim of size {n}")
    return x[(slice(None),) * ax + (i,)]


def _slice_kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
    x = xs[0]
    ax = c.int_attr("dim") + c.offset(0)
    start, stop = c.int_attr("start"), c.int_attr("stop")
    n = x.shape[ax]
    if not 0 <= start <= stop <= n:
        raise BackendError(
            f"{c.op!r}: slice [{start}:{stop}] is outside the per-point dim of size {n} "
            "(bounds must satisfy 0 <= start <= stop <= size)"
        )
    return x[(slice(None),) * ax + (slice(start, stop),)]


def _permute_dims(c: KernelCall) -> tuple[int, ...]:
    o = c.offset(0)
    return tuple(range(o)) + tuple(int(d) + o for d in c.attr("dims"))


def _reshape_kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
    lead = c.batch if c.batched[0] else ()
    return xs[0].reshape(lead + c.shape_attr("shape"))


def _expand_kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
    x = xs[0]
    shape = c.shape_attr("shape")
    if not c.batched[0]:
        return be.broadcast_to(x, shape)
    nb = len(c.batch)
    s = tuple(x.shape)
    pad = len(shape) - (len(s) - nb)
    if pad > 0:
        x = x.reshape(s[:nb] + (1,) * pad + s[nb:])
    return be.broadcast_to(x, c.batch + shape)


def _all_batched(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> tuple[list[Any], int]:
    """Broadcast every input to batched (when any is) and return them with the dim offset."""
    if not c.any_batched:
        return list(xs), 0
    ys = [x if b else be.broadcast_batch(x, c.batch) for x, b in zip(xs, c.batched, strict=True)]
    return ys, len(c.batch)


def multi_along_dim(fn: Callable[[Sequence[Any], int], Any]) -> Kernel:
    """``fn(xs, axis)`` for CAT/STACK: all inputs broadcast to batched first."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        ys, o = _all_batched(be, c, xs)
        return fn(ys, c.int_attr("dim") + o)

    return kernel


def gather(fn: Callable[[Any, Any], Any]) -> Kernel:
    """``fn(x, idx)`` = ``x[..., idx]`` on equal leading shapes (``x``: ``(..., n)``, ``idx``: ``(...)``)."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        x, idx = align_ranks(c, xs, trailing=(1, 0))
        lead = tuple(np.broadcast_shapes(tuple(x.shape[:-1]), tuple(idx.shape)))
        return fn(be.broadcast_to(x, lead + (x.shape[-1],)), be.broadcast_to(idx, lead))

    return kernel


def _flat_batch(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> tuple[Any, Any]:
    """Both inputs with the batch dims broadcast and flattened into one leading dim."""
    nb, p = len(c.batch), int(np.prod(c.batch, dtype=np.int64))
    out = []
    for k, x in enumerate(xs):
        if not c.batched[k]:
            x = be.broadcast_to(x, tuple(c.batch) + tuple(x.shape))
        out.append(x.reshape((p,) + tuple(x.shape[nb:])))
    return out[0], out[1]


def take_rows(take: Callable[[Any, Any, int], Any], take_batched: Callable[[Any, Any], Any]) -> Kernel:
    """``x[idx]`` along per-point dim 0. ``take(x, idx, axis)`` serves an unbatched ``idx``;
    ``take_batched(x, idx)`` takes ``x[p, idx[p]]`` for each row ``p`` of flattened batch dims."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        x, idx = xs
        if not c.batched[1]:
            return take(x, idx, c.offset(0))
        xf, idf = _flat_batch(be, c, xs)
        out = take_batched(xf, idf)
        return out.reshape(tuple(c.batch) + tuple(out.shape[1:]))

    return kernel


def index_add_rows(
    add: Callable[[Any, Any, int, int], Any], add_batched: Callable[[Any, Any, int], Any]
) -> Kernel:
    """Zeros with ``size`` rows along per-point dim 0 and ``g``'s rows added at ``idx``
    (repeated indices accumulate). ``add(g, idx, axis, size)`` serves an unbatched ``idx``,
    ``add_batched(g, idx, size)`` flattened batch dims (one leading dim)."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        g, idx = xs
        n = c.int_attr("size")
        if not c.batched[1]:
            return add(g, idx, c.offset(0), n)
        gf, idf = _flat_batch(be, c, xs)
        out = add_batched(gf, idf, n)
        return out.reshape(tuple(c.batch) + tuple(out.shape[1:]))

    return kernel


def matmul(fn: Callable[[Any, Any], Any], transposed_lhs: Callable[[Any, Any], Any] | None = None) -> Kernel:
    """NumPy matmul on per-point shapes, 1-D operands included, either side batched.

    ``transposed_lhs(a, b)``, where given, computes the products whose op carries
    ``lhs_transposed=True`` (the left operand is a transpose, in the same compiled region, of
    a row-major array: :func:`timerl.runtime.fusion.hinted_ops`); the attribute is a hint about
    memory layout and does not change the value."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        a, b = xs
        oa, ob = c.offset(0), c.offset(1)
        if ob == 0 and b.ndim == 2 and (transposed_lhs is None or not c.attr("lhs_transposed", False)):
            # one matrix on the right: the library's matmul broadcasts a's leading dims itself
            # (a per-point vector's batch included), with no reshapes (Torch, (8, 4) @ (4, 64):
            # 15.6 -> 3.4 us per call)
            return fn(a, b)
        a_vec, b_vec = a.ndim - oa == 1, b.ndim - ob == 1
        if a_vec:  # (k,) -> (1, k)
            s = tuple(a.shape)
            a = a.reshape(s[:oa] + (1,) + s[oa:])
        if b_vec:  # (k,) -> (k, 1)
            b = b.reshape(tuple(b.shape) + (1,))
        a, b = align_ranks(c, [a, b])
        hinted = transposed_lhs is not None and not a_vec and c.attr("lhs_transposed", False)
        out = transposed_lhs(a, b) if hinted else fn(a, b)  # type: ignore[misc]
        if b_vec:
            out = out.reshape(tuple(out.shape)[:-1])
        if a_vec:
            s = tuple(out.shape)
            out = out.reshape(s[:-1] if b_vec else s[:-2] + s[-1:])
        return out

    return kernel


def partly_broadcast(sa: tuple[int, ...], sb: tuple[int, ...]) -> bool:
    """Whether two batch shapes of a product differ with neither all ones: a plain batched
    matmul then copies the broadcast operand (PPO's per-point ``g @ W^T`` with ``W`` per agent,
    ``(4, 16, 128, 1, 64) @ (1, 16, 1, 64, 64)``: the weights copied 512 times, 128 MB, and
    8,192 one-row products; on JAX 150 ms of a 16-agent learner region, 13 ms as one einsum,
    ``jax_backend._matmul``)."""
    return sa != sb and any(x != 1 for x in sa) and any(y != 1 for y in sb)


def matmul_broadcast(einsum: Callable[..., Any], a: Any, b: Any) -> Any:
    """``a @ b`` (same ranks) with partly broadcast batch dims as one ``einsum(spec, a, b)``:
    dims where only ``a`` varies become rows of its products, dims where both vary a batch of
    products, dims where only ``b`` varies columns."""
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    ia, ib, io = "", "", ""
    a_keep, b_keep = [], []
    for x, y in zip(a.shape[:-2], b.shape[:-2], strict=True):
        if x == 1 and y == 1:
            continue
        d = next(letters)
        io += d
        if x != 1:
            ia += d
            a_keep.append(x)
        if y != 1:
            ib += d
            b_keep.append(y)
    m, k, n = next(letters), next(letters), next(letters)
    a2 = a.reshape(tuple(a_keep) + tuple(a.shape[-2:]))
    b2 = b.reshape(tuple(b_keep) + tuple(b.shape[-2:]))
    out = einsum(f"{ia}{m}{k},{ib}{k}{n}->{io}{m}{n}", a2, b2)
    lead = tuple(max(x, y) for x, y in zip(a.shape[:-2], b.shape[:-2], strict=True))
    return out.reshape(lead + (a.shape[-2], b.shape[-1]))


def _discount_column(be: AbstractBackend, gamma: float, k: int, trailing: int, like: Any) -> Any:
    """``gamma ** arange(k)`` (computed in float64) shaped ``(k, 1, ..., 1)`` with ``like``'s dtype."""
    w = float(gamma) ** np.arange(k, dtype=np.float64)
    w = be.from_numpy(w.reshape((k,) + (1,) * trailing))
    return be.cast_like(w, like)


def discounted_sum(sum_fn: Callable[[Any, int], Any]) -> Kernel:
    """DISCOUNTED_SUM: ``sum_k gamma**k x[k]`` over the per-point dim 0; ``sum_fn(x, axis)`` sums."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        x = xs[0]
        ax = c.offset(0)
        w = _discount_column(be, c.attr("gamma"), x.shape[ax], x.ndim - ax - 1, x)
        return sum_fn(x * w, ax)

    return kernel


def suffix_sum(shift: Callable[[Any, int, int], Any]) -> Kernel:
    """SUFFIX_SUM: ``y[k] = sum_{j >= k} gamma**(j - k) x[j]`` along the per-point dim 0, by
    doubling: after the step with shift ``s``, ``y[k]`` sums rows ``k .. k + 2s - 1``
    (``y += gamma**s * y[k + s]``), so ``ceil(log2(n))`` elementwise steps (no loop over
    rows). ``shift(y, axis, s)``: rows ``s ..`` of ``y`` along ``axis``, then ``s`` zero rows."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        y = xs[0]
        ax = c.offset(0)
        n = int(y.shape[ax])
        gamma = float(c.attr("gamma"))
        s = 1
        while s < n:
            later = shift(y, ax, s)
            y = y + (later if gamma == 1.0 else later * gamma**s)
            s *= 2
        return y

    return kernel


def _discount_weights_kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
    """DISCOUNT_WEIGHTS(g, x): ``out[k, ...] = gamma**k g[...]`` with x's per-point shape."""
    g, x = xs
    og, ox = c.offset(0), c.offset(1)
    k = x.shape[ox]
    s = tuple(g.shape)
    g = g.reshape(s[:og] + (1,) + s[og:])  # new per-point dim 0
    w = _discount_column(be, c.attr("gamma"), k, len(s) - og, g)
    lead = c.batch if c.any_batched else ()
    return be.broadcast_to(g * w, lead + tuple(x.shape[ox:]))


def linear_scan(scan: Callable[[Any, Any, Any, bool], Any]) -> Kernel:
    """LINEAR_SCAN: ``scan(x, c, y0, reverse)`` with the scanned axis moved to the front
    (``x``, ``c``: ``(n - 1,) + rest``; ``y0``: ``rest``; result ``(n,) + rest``) and moved
    back after."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        x, coef, y0 = xs
        nb = len(c.batch) if c.any_batched else 0
        full = tuple(c.batch) if c.any_batched else ()
        rest = tuple(x.shape[c.offset(0) + 1 :]) if x.ndim > c.offset(0) else ()
        n = x.shape[c.offset(0)]  # rows of x and c: one fewer than the result's

        def front(v: Any, row: bool) -> Any:
            v = be.broadcast_to(v, full + (() if row else (n,)) + rest)
            if row or nb == 0:
                return v
            perm = (nb,) + tuple(range(nb)) + tuple(range(nb + 1, v.ndim))
            return be.permute_axes(v, perm)

        ys = scan(front(x, False), front(coef, False), front(y0, True), bool(c.attr("reverse")))
        if nb == 0:
            return ys
        perm = tuple(range(1, nb + 1)) + (0,) + tuple(range(nb + 1, ys.ndim))
        return be.permute_axes(ys, perm)

    return kernel


def permute(fn: Callable[[Any, tuple[int, ...]], Any]) -> Kernel:
    """``fn(x, axes)`` with batch dims kept in front."""
    return lambda be, c, xs: fn(xs[0], _permute_dims(c))


def pad_slice(fn: Callable[[Any, int, int, int], Any]) -> Kernel:
    """PAD_SLICE: ``fn(x, axis, before, after)`` pads with zeros along ``axis``."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        x = xs[0]
        ax = c.int_attr("dim") + c.offset(0)
        start, size = c.int_attr("start"), c.int_attr("size")
        n = x.shape[ax]
        if start < 0 or start + n > size:
            raise BackendError(
                f"{c.op!r}: cannot place a per-point dim of size {n} at {start} in a dim of size {size}"
            )
        return fn(x, ax, start, size - start - n)

    return kernel


def random(fn: Callable[[AbstractBackend, tuple[int, ...], DType], Any]) -> Kernel:
    """``fn(be, shape, dtype)`` draws ``batch + shape`` samples (independent per batch index)."""

    def kernel(be: AbstractBackend, c: KernelCall, xs: Sequence[Any]) -> Any:
        dt = c.dtype_attr()
        if not dt.is_float:
            raise BackendError(f"{c.op!r}: random ops need a float dtype, got {dt.name}")
        return fn(be, c.batch + c.shape_attr("shape"), dt)

    return kernel


def accumulate_dtype(dt: DType) -> DType:
    """Dtype of SUM/CUMSUM results: floats keep theirs, ints and bools accumulate in int64 (as NumPy)."""
    return dt if dt.is_float else DType.int64


def shared_kernels() -> dict[OpKind, Kernel]:
    """Kernels written once with array indexing/``reshape`` (valid for JAX and torch tensors)."""
    return {
        OpKind.CONST: lambda be, c, xs: be.const_value(c.op),
        OpKind.INDEX: _index_kernel,
        OpKind.SLICE: _slice_kernel,
        OpKind.RESHAPE: _reshape_kernel,
        OpKind.EXPAND: _expand_kernel,
        OpKind.IDENTITY: lambda be, c, xs: xs[0],
        OpKind.DISCOUNT_WEIGHTS: _discount_weights_kernel,
    }
