"""gymnax environments as UDF ops: ``trl.env.make("gymnax.CartPole-v1", num_envs=B)``.

gymnax environments are pure JAX functions (``reset(key, params)``, ``step(key, state,
action, params)``). Here both are vmapped over the ``B`` envs of the batch dim and jitted,
once per ``(id, kwargs)`` per process (module-level cache, like ``brax_env``). The batch of
gymnax states and the PRNG key of the running episode live in the UDF object, like the
gymnasium vector env does in ``GymEnv``.

Values cross as backend tensors (``array_io = "dlpack"``, see :class:`timerl.rt.udf.UDFFn`):
with the JAX backend the jax arrays are used as they are; with the Torch backend they cross
through DLPack, which on CPU shares the buffers (no copies either way; an int64 action
tensor is narrowed to int32 on the way in, one small copy).

Two modes, with the semantics of ``GymEnv``:

- episodic (default): once an env is done it stays done (reward 0, its last observation
  repeated, ``done`` true) until the next reset, so the dynamic bound ``T: d`` ends the
  episode when every env is done. The step that ends an episode returns that episode's
  final observation (gymnax's ``info["final_observation"]``).
- ``autoreset=True`` (fixed-length rollouts): gymnax resets a finished env inside ``step``
  already; ``step`` returns the first observation of its next episode, the reward of the
  last step and ``done = terminated | truncated`` (gymnasium's ``SAME_STEP`` mode).

Keys (so a run can be replayed with gymnax alone): reset at point ``p`` (the reset's domain
without the batch dim) takes ``k = PRNGKey(seed + 7919 * sum(p))``, splits it into
``(k_reset, k_run)`` and resets env ``j`` with ``split(k_reset, B)[j]``. Each ``step``
splits ``k_run`` into ``(k_run, k_step)`` and steps env ``j`` with ``split(k_step, B)[j]``.

gymnax runs with 32-bit types whatever ``jax_enable_x64`` says (the JAX backend turns it on
process-wide): its functions are traced and called under ``jax.enable_x64(False)``. Keyword
arguments of ``make`` that name a field of the env's ``EnvParams`` (e.g.
``max_steps_in_episode=200``) replace that parameter; the others go to gymnax's constructor.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timerl.envs.common import agent_seeds, bind_agent_seeds, jax_argument, static_num_envs
from timerl.envs.gym_env import GymEnv
from timerl.errors import EnvNotResetError, TimeRLError
from timerl.symbolic import Sym

log = logging.getLogger("timerl.envs")


def _import_gymnax() -> Any:
    try:
        import gymnax
    except ImportError as exc:
        raise TimeRLError(
            "gymnax environments need the optional dependency gymnax: pip install 'timerl[gymnax]' "
            f"(gymnax==1.0.1 and six); import failed: {exc}"
        ) from exc
    return gymnax


def gymnax_env_names() -> list[str]:
    """Ids usable as ``"gymnax.<id>"``."""
    return sorted(_import_gymnax().registered_envs)


def _to_gym_space(space: Any, what: str, env_id: str) -> Any:
    """A gymnax ``Discrete``/``Box`` as the gymnasium space timerl's specs understand."""
    import gymnasium as gym
    from gymnax.environments import spaces

    if isinstance(space, spaces.Discrete):
        return gym.spaces.Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        shape = tuple(int(d) for d in space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float32), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float32), shape)
        return gym.spaces.Box(low, high, shape, np.float32)
    raise TimeRLError(
        f"gymnax environment {env_id!r}: its {what} space {space!r} is not supported "
        "(only Discrete and Box spaces are)"
    )


class _Compiled:
    """One gymnax env with its batched, jitted ``reset`` and ``step`` (shared per process)."""

    def __init__(self, env_id: str, kwargs: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp

        gymnax = _import_gymnax()
        names = sorted(gymnax.registered_envs)
        if env_id not in names:
            raise TimeRLError(
                f"unknown gymnax environment {env_id!r}; valid ids: {', '.join(names)} "
                "(use 'gymnax.<id>', e.g. 'gymnax.CartPole-v1')"
            )
        with jax.enable_x64(False):
            env, params = gymnax.make(env_id)
            fields = {f.name for f in dataclasses.fields(params)}
            overrides = {k: v for k, v in kwargs.items() if k in fields}
            env_kwargs = {k: v for k, v in kwargs.items() if k not in fields}
            try:
                if env_kwargs:
                    env, params = gymnax.make(env_id, **env_kwargs)
                if overrides:
                    params = params.replace(**overrides)
            except Exception as exc:
                raise TimeRLError(
                    f"gymnax environment {env_id!r} cannot be created with {kwargs} (parameters: "
                    f"{sorted(fields)}; other arguments go to its constructor): {type(exc).__name__}: {exc}"
                ) from exc
            self.obs_space = _to_gym_space(env.observation_space(params), "observation", env_id)
            self.action_space = _to_gym_space(env.action_space(params), "action", env_id)
        self.env_id = env_id
        self.env = env
        self.params = params
        discrete = isinstance(env.action_space(params), gymnax.environments.spaces.Discrete)

        def strong(tree: Any) -> Any:
            # reset makes weak-typed leaves (e.g. ``time``) where step makes strong ones:
            # normalise, or the second step call would retrace and compile again.
            return jax.tree_util.tree_map(lambda x: jax.lax.convert_element_type(x, x.dtype), tree)

        def reset(seed: jax.Array, n: int) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
            k_reset, k_run = jax.random.split(jax.random.PRNGKey(seed))
            obs, st = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, n), params)
            return strong(st), obs.astype(jnp.float32), jnp.zeros(n, jnp.bool_), k_run

        def transition(st: Any, key: jax.Array, action: jax.Array) -> tuple[Any, ...]:
            key, k_step = jax.random.split(key)
            a = action.astype(jnp.int32) if discrete else action.astype(jnp.float32)
            keys = jax.random.split(k_step, a.shape[0])
            obs, nst, rew, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                keys, st, a, params
            )
            return strong(nst), key, obs, rew.astype(jnp.float32), term | trunc, info

        def step_autoreset(st: Any, key: jax.Array, action: jax.Array) -> tuple[Any, ...]:
            nst, key, obs, rew, done, _ = transition(st, key, action)
            return nst, key, obs.astype(jnp.float32), rew, done

        def step_episodic(
            st: Any, key: jax.Array, last_obs: jax.Array, done: jax.Array, action: jax.Array
        ) -> tuple[Any, ...]:
            nst, key, _, rew, ended, info = transition(st, key, action)
            final = info["final_observation"].astype(jnp.float32)  # before gymnax's auto-reset
            keep = done.reshape(done.shape + (1,) * (final.ndim - 1))
            obs = jnp.where(keep, last_obs, final)
            rew = jnp.where(done, 0.0, rew).astype(jnp.float32)
            return nst, key, obs, rew, done | ended

        self.reset = jax.jit(reset, static_argnums=(1,))
        self.step_autoreset = jax.jit(step_autoreset)
        self.step_episodic = jax.jit(step_episodic)

        # agents (make(..., agents=S)): the same functions mapped over a leading agent axis,
        # one seed per agent, so each agent's envs run as a one-agent env with its seed
        def reset_agents(seeds: jax.Array, n: int) -> tuple[Any, ...]:
            return jax.vmap(lambda x: reset(x, n))(seeds)

        self.reset_agents = jax.jit(reset_agents, static_argnums=(1,))
        self.step_autoreset_agents = jax.jit(jax.vmap(step_autoreset))
        self.step_episodic_agents = jax.jit(jax.vmap(step_episodic))
        # Every argument is committed to this device: a mix of committed and uncommitted
        # arguments would compile ``step`` a second time (as in brax_env).
        self.device = jax.devices()[0]


_CACHE: dict[tuple[str, str], _Compiled] = {}
_CACHE_LOCK = threading.Lock()


def compiled(env_id: str, **kwargs: Any) -> _Compiled:
    """The shared :class:`_Compiled` for ``(env_id, kwargs)`` (created on first use)."""
    key = (env_id, repr(sorted(kwargs.items())))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            hit = _CACHE[key] = _Compiled(env_id, dict(kwargs))
    return hit


class _GymnaxState:
    """The live batch of gymnax states, the running PRNG key and (episodic) done flags."""

    array_io = "dlpack"  # the UDFs built on this state exchange backend tensors (see UDFFn)

    def __init__(
        self,
        c: _Compiled,
        num_envs: Any,
        seed: int | Sequence[int],
        autoreset: bool,
        agents: Sym | None = None,
    ) -> None:
        self.c = c
        self.env_id = f"gymnax.{c.env_id}"
        self.num_envs = num_envs
        self.agents = agents  # the agent dim's bound: arrays cross as (B, S, ...), state as (S, B, ...)
        self.seeds = agent_seeds(self.env_id, seed, agents)
        self.seed = self.seeds[0]
        self.autoreset = autoreset
        self.batched = isinstance(num_envs, Sym)
        self.n = 0
        self.state: Any = None
        self.key: Any = None
        self.last_obs: Any = None
        self.done: Any = None
        fns = (c.reset, c.step_autoreset, c.step_episodic)
        if agents is not None:
            fns = (c.reset_agents, c.step_autoreset_agents, c.step_episodic_agents)
        self._reset, self._step_autoreset, self._step_episodic = fns

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.n = static_num_envs(self.env_id, self.num_envs, bounds)
        if self.agents is not None:
            self.seeds = bind_agent_seeds(self.env_id, self.seeds, self.agents, bounds)

    def _out(self, x: Any) -> Any:
        if self.agents is not None:
            import jax.numpy as jnp

            return jnp.swapaxes(x, 0, 1)
        return x if self.batched else x[0]

    def _in(self, action: Any) -> Any:
        if self.agents is not None:
            import jax.numpy as jnp

            return jnp.swapaxes(action, 0, 1)
        return action if self.batched else action[None]

    def reset(self, point: dict[str, int]) -> Any:
        import jax

        k = sum(point.values())
        seeds = [(s + 7919 * k) % (2**32) for s in self.seeds]
        with jax.enable_x64(False):
            arg = np.uint32(seeds[0]) if self.agents is None else np.asarray(seeds, np.uint32)
            seed_arr = jax.device_put(arg, self.c.device)
            self.state, self.last_obs, self.done, self.key = self._reset(seed_arr, self.n)
        return self._out(self.last_obs)

    def step(self, action: Any) -> tuple[Any, Any, Any]:
        import jax

        if self.state is None:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        with jax.enable_x64(False):
            action = self._in(jax_argument(action, self.c.device))
            if self.autoreset:
                self.state, self.key, obs, rew, done = self._step_autoreset(self.state, self.key, action)
                return self._out(obs), self._out(rew), self._out(done)
            self.state, self.key, self.last_obs, rew, self.done = self._step_episodic(
                self.state, self.key, self.last_obs, self.done, action
            )
        return self._out(self.last_obs), self._out(rew), self._out(self.done)

    def snapshot(self) -> Any:
        """The live state as host arrays (checkpoints; None before the first reset)."""
        import jax

        if self.state is None:
            return None
        return jax.device_get((self.state, self.key, self.last_obs, self.done))

    def restore(self, snap: Any) -> None:
        """Continue from :meth:`snapshot`'s value (a resumed run)."""
        import jax

        if snap is None:
            self.state = self.key = self.last_obs = self.done = None
            return
        self.state, self.key, self.last_obs, self.done = jax.device_put(snap, self.c.device)

    def pure_step(self) -> Any:
        """``step`` as a pure function of the live state (threaded through a scan's carry)."""
        from timerl.runtime.scan import PureStep

        out, step_autoreset, step_episodic = self._out, self._step_autoreset, self._step_episodic

        def get_state() -> Any:
            if self.state is None:
                raise EnvNotResetError(f"env {self.env_id}: step before reset")
            if self.autoreset:
                return (self.state, self.key)
            return (self.state, self.key, self.last_obs, self.done)

        def set_state(st: Any) -> None:
            if self.autoreset:
                self.state, self.key = st
            else:
                self.state, self.key, self.last_obs, self.done = st

        def step(st: Any, inputs: list[Any]) -> tuple[Any, list[Any]]:
            import jax
            import jax.numpy as jnp

            action = self._in(inputs[0])
            if jnp.issubdtype(action.dtype, jnp.integer):
                action = action.astype(jnp.int32)  # as the env's own (32-bit) step receives it
            with jax.enable_x64(False):  # traced as the interpreted step runs it
                if self.autoreset:
                    state, key, obs, rew, done = step_autoreset(st[0], st[1], action)
                    return (state, key), [out(obs), out(rew), out(done)]
                state, key, last, rew, done = step_episodic(*st, action)
            return (state, key, last, done), [out(last), out(rew), out(done)]

        return PureStep(get_state, set_state, step)


class GymnaxEnv(GymEnv):
    """A gymnax environment family usable in RT programs (same interface as ``GymEnv``).

    ``trl.env.make("gymnax.<id>", num_envs=B, seed=0, autoreset=False, **kwargs)``: keyword
    arguments naming a field of the env's ``EnvParams`` (e.g. ``max_steps_in_episode``) set
    that parameter; the others go to gymnax's environment constructor.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: Any,
        seed: int | Sequence[int] = 0,
        autoreset: bool = False,
        agents: Sym | None = None,
        **kwargs: Any,
    ) -> None:
        c = compiled(env_id, **kwargs)
        self.compiled = c
        self.obs_space = c.obs_space
        self.action_space = c.action_space
        self.autoreset = autoreset
        state = _GymnaxState(c, num_envs, seed, autoreset, agents)
        self._init_wrapper(f"gymnax.{env_id}", num_envs, state, agents)
