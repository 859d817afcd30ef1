"""brax environments as UDF ops: ``trl.env.make("brax.inverted_pendulum", num_envs=B)``.

A brax env is a pair of pure JAX functions. Here ``reset`` and ``step`` are vmapped over
the ``B`` envs of the batch dim and jitted, once per ``(name, physics backend, kwargs)``
per process (module-level cache; jax's own cache then holds one executable per batch
size), so several programs, or tests, share one compilation. The brax ``State`` pytree
lives in the UDF object, like the gymnasium vector env does in ``GymEnv``.

Values cross as backend tensors (``array_io = "dlpack"``, see :class:`timerl.rt.udf.UDFFn`):
with the JAX backend the jax arrays are used as they are, with the Torch backend they
cross through DLPack, which on CPU shares the buffers (no copies either way).

Semantics match ``GymEnv``: once an env is done it stays done (reward 0, its last
observation repeated, ``done`` true) until the next reset, so the dynamic bound ``T: d``
ends the episode when every env is done. An env is done when brax says so or after
``max_steps`` steps (default 1000, brax's usual episode length), so episodes always end.
Reset at point ``p`` (the reset's domain without the batch dim) draws the ``B`` initial
states from ``PRNGKey(seed + 7919 * sum(p))``. Actions are clipped to brax's ``[-1, 1]``.

brax runs with 32-bit types whatever ``jax_enable_x64`` says (the JAX backend turns it on
process-wide): its functions are traced and called under ``jax.enable_x64(False)``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from timerl.envs.common import jax_argument, static_num_envs
from timerl.envs.gym_env import GymEnv
from timerl.errors import EnvNotResetError, RTDefinitionError, TimeRLError
from timerl.symbolic import Sym

log = logging.getLogger("timerl.envs")

DEFAULT_BACKEND = "spring"
DEFAULT_MAX_STEPS = 1000


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide brax's known noise: its "not actively maintained" UserWarning and the
    deprecation warnings of its dependencies (jaxopt, mujoco ``Data.ncon``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not actively being maintained.*", category=UserWarning)
        warnings.filterwarnings(
            "ignore", message=".*(JAXopt is no longer|ncon).*", category=DeprecationWarning
        )
        yield


def _import_brax() -> Any:
    if "brax.envs" not in sys.modules:
        buf = io.StringIO()
        # mujoco.mjx prints "Failed to import warp: ..." (an optional GPU backend) to stdout.
        with contextlib.redirect_stdout(buf), _quiet():
            try:
                import brax.envs  # noqa: F401  (heavy, optional: imported on first use)
            except ImportError as exc:
                raise TimeRLError(
                    "brax environments need the optional dependency brax: pip install 'timerl[brax]' "
                    f"(brax==0.14.2); import failed: {exc}"
                ) from exc
        if buf.getvalue().strip():
            log.debug("importing brax printed: %s", buf.getvalue().strip())
    return sys.modules["brax.envs"]


def brax_env_names() -> list[str]:
    """Names usable as ``"brax.<name>"``."""
    benvs = _import_brax()
    return sorted(getattr(benvs, "_envs", {}))


class _Compiled:
    """One brax env with its batched, jitted ``reset`` and ``step`` (shared per process)."""

    def __init__(self, name: str, backend: str, kwargs: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp

        benvs = _import_brax()
        names = brax_env_names()
        if name not in names:
            raise TimeRLError(
                f"unknown brax environment {name!r}; valid names: {', '.join(names)} "
                "(use 'brax.<name>', e.g. 'brax.inverted_pendulum')"
            )
        with jax.enable_x64(False), _quiet():
            try:
                env = benvs.get_environment(name, backend=backend, **kwargs)
            except Exception as exc:
                raise TimeRLError(
                    f"brax environment {name!r} (backend {backend!r}, kwargs {kwargs}) cannot be "
                    f"created: {type(exc).__name__}: {exc}"
                ) from exc
            probe = jax.eval_shape(env.reset, jax.ShapeDtypeStruct((2,), jnp.uint32))
        if not isinstance(probe.obs, jax.ShapeDtypeStruct) or len(probe.obs.shape) != 1:
            raise TimeRLError(
                f"brax environment {name!r}: only flat array observations are supported, got {probe.obs}"
            )
        self.name = name
        self.env = env
        self.obs_size = int(probe.obs.shape[0])
        self.act_size = int(env.action_size)

        def strong(tree: Any) -> Any:
            # reset makes strong-typed leaves where step makes weak-typed ones: normalise, or
            # the second step call would retrace and recompile (another 15+ s on CPU).
            return jax.tree_util.tree_map(lambda x: jax.lax.convert_element_type(x, x.dtype), tree)

        def reset(seed: jax.Array, n: int) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
            keys = jax.random.split(jax.random.PRNGKey(seed), n)
            st = strong(jax.vmap(env.reset)(keys))
            return st, st.obs.astype(jnp.float32), jnp.zeros(n, jnp.bool_), jnp.zeros(n, jnp.int32)

        def step(
            st: Any,
            last_obs: jax.Array,
            done: jax.Array,
            steps: jax.Array,
            action: jax.Array,
            limit: jax.Array,
        ) -> tuple[Any, jax.Array, jax.Array, jax.Array, jax.Array]:
            a = jnp.clip(action.astype(jnp.float32), -1.0, 1.0)
            nst = strong(jax.vmap(env.step)(st, a))

            def keep(new: jax.Array, old: jax.Array) -> jax.Array:  # done envs stay frozen
                return jnp.where(done.reshape(done.shape + (1,) * (new.ndim - 1)), old, new)

            nst = jax.tree_util.tree_map(keep, nst, st)
            obs = jnp.where(done[:, None], last_obs, nst.obs.astype(jnp.float32))
            rew = jnp.where(done, 0.0, nst.reward).astype(jnp.float32)
            steps = steps + jnp.where(done, 0, 1).astype(jnp.int32)
            ndone = done | (nst.done > 0) | (steps >= limit)
            return nst, obs, rew, ndone, steps

        self.reset = jax.jit(reset, static_argnums=(1,))
        self.step = jax.jit(step)
        # Every argument is committed to this device: a mix of committed and uncommitted
        # arguments (jit outputs inherit it) would compile ``step`` a second time.
        self.device = jax.devices()[0]
        self._traced: set[tuple[str, int]] = set()

    def tracing(self, fn: str, n: int) -> contextlib.AbstractContextManager[None]:
        """Around a call of ``fn`` with batch ``n``: :func:`_quiet` for the first (traced) call
        only, since touching the warning filters on every step would reset Python's
        once-per-location warning registries."""
        if (fn, n) in self._traced:
            return contextlib.nullcontext()
        self._traced.add((fn, n))
        return _quiet()


_CACHE: dict[tuple[str, str, str], _Compiled] = {}
_CACHE_LOCK = threading.Lock()


def compiled(name: str, backend: str = DEFAULT_BACKEND, **kwargs: Any) -> _Compiled:
    """The shared :class:`_Compiled` for ``(name, backend, kwargs)`` (created on first use)."""
    key = (name, backend, repr(sorted(kwargs.items())))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            hit = _CACHE[key] = _Compiled(name, backend, dict(kwargs))
    return hit


class _BraxState:
    """The live batch of brax states and per-env done flags / step counters."""

    array_io = "dlpack"  # the UDFs built on this state exchange backend tensors (see UDFFn)

    def __init__(self, c: _Compiled, num_envs: Any, seed: int, max_steps: int, batched: bool) -> None:
        self.c = c
        self.env_id = f"brax.{c.name}"
        self.num_envs = num_envs
        self.seed = int(seed)
        self.max_steps = int(max_steps)
        self.batched = batched
        self.n = 0
        self.state: Any = None
        self.last_obs: Any = None
        self.done: Any = None
        self.steps: Any = None

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.n = static_num_envs(self.env_id, self.num_envs, bounds)

    def _out(self, x: Any) -> Any:
        return x if self.batched else x[0]

    def reset(self, point: dict[str, int]) -> Any:
        import jax

        k = sum(point.values())
        seed = (self.seed + 7919 * k) % (2**32)
        with jax.enable_x64(False), self.c.tracing("reset", self.n):
            seed_arr = jax.device_put(np.uint32(seed), self.c.device)
            self.state, self.last_obs, self.done, self.steps = self.c.reset(seed_arr, self.n)
        return self._out(self.last_obs)

    def step(self, action: Any) -> tuple[Any, Any, Any]:
        import jax

        if self.state is None:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        action = jax_argument(action, self.c.device)
        if not self.batched:
            action = action[None]
        with jax.enable_x64(False), self.c.tracing("step", self.n):
            limit = jax.device_put(np.int32(self.max_steps), self.c.device)
            self.state, self.last_obs, rew, self.done, self.steps = self.c.step(
                self.state, self.last_obs, self.done, self.steps, action, limit
            )
        return self._out(self.last_obs), self._out(rew), self._out(self.done)


class BraxEnv(GymEnv):
    """A brax environment family usable in RT programs (same interface as ``GymEnv``).

    ``trl.env.make("brax.<name>", num_envs=B, seed=0, backend="spring", max_steps=1000,
    **kwargs)``: ``backend`` is brax's physics pipeline (``spring``, ``positional``,
    ``generalized``, ``mjx``); other keyword arguments go to the brax env's constructor.
    """

    def __init__(
        self,
        name: str,
        num_envs: Any,
        seed: int = 0,
        backend: str = DEFAULT_BACKEND,
        max_steps: int = DEFAULT_MAX_STEPS,
        **kwargs: Any,
    ) -> None:
        import gymnasium as gym

        if int(max_steps) < 1:
            raise RTDefinitionError(f"env brax.{name}: max_steps must be >= 1, got {max_steps}")
        c = compiled(name, backend, **kwargs)
        self.compiled = c
        self.obs_space = gym.spaces.Box(-np.inf, np.inf, (c.obs_size,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (c.act_size,), np.float32)
        state = _BraxState(c, num_envs, seed, max_steps, batched=isinstance(num_envs, Sym))
        self._init_wrapper(f"brax.{name}", num_envs, state)
