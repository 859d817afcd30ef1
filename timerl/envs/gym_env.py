"""gymnasium vector environments as UDF ops.

``reset(domain=(b, i))`` and ``step(action)`` become UDF nodes vectorized over the
batch dim ``b`` (bound ``num_envs``): one gymnasium vector env steps all ``B`` envs at
once. Episodes end per env; once an env is done it stays done (reward 0, its last
observation repeated, ``done`` true) until the next reset, so the dynamic bound
``T: d`` ends the episode when *every* env is done (``T`` = longest episode). Reset
``i`` is seeded with ``seed + i``, so a run is reproducible whatever the schedule.

With ``autoreset=True`` (fixed-length rollouts, as CleanRL runs PPO) an env that finishes is
reset inside the same ``step`` call: ``step`` returns the first observation of its next
episode, the reward of the last step and ``done`` true (gymnasium's ``SAME_STEP`` mode).
``reset`` then runs once (domain ``(b,)``) and ``step`` may vary over any dims beyond it
(``(b, i, t)``: iteration ``i`` continues where ``i - 1`` stopped).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from timerl.envs.common import agent_seeds, bind_agent_seeds, static_num_envs
from timerl.errors import EnvNotResetError, RTDefinitionError, RuntimeExecutionError, TimeRLError
from timerl.pdg.ops import DType
from timerl.rt.context import current
from timerl.rt.creation import space_spec
from timerl.rt.graph import BInput
from timerl.rt.tensor import RecurrentTensor
from timerl.rt.udf import UDFFn, udf
from timerl.symbolic import Slice, Sym, lift

log = logging.getLogger("timerl.envs")


class _GymState:
    """The live vector env and per-env done flags (created at compile time by ``bind``)."""

    def __init__(
        self, env_id: str, num_envs: Any, seed: int, kwargs: dict[str, Any], autoreset: bool = False
    ) -> None:
        self.env_id = env_id
        self.autoreset = autoreset
        self.num_envs = num_envs
        self.seed = seed
        self.kwargs = kwargs
        self.venv: Any = None
        self.n = 0
        self.batched = isinstance(num_envs, Sym)  # else outputs drop the vector env's leading dim
        self.done: np.ndarray | None = None
        self.last_obs: np.ndarray | None = None

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        import gymnasium as gym

        n = static_num_envs(self.env_id, self.num_envs, bounds)
        if self.venv is not None and self.n == n:
            return
        self.venv = None
        try:
            venv = gym.make_vec(
                self.env_id, num_envs=n, vectorization_mode="vector_entry_point", **self.kwargs
            )
            # autoreset: a native vector env either resets in the same step already or is one
            # whose finished envs we can reset in place (gymnasium's CartPoleVectorEnv)
            if not self.autoreset or _same_step_mode(venv) or _resettable_in_place(venv):
                self.venv = venv
        except Exception:  # no native vector env: fall back to a synchronous one
            pass
        if self.venv is None:
            vk = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP} if self.autoreset else {}
            self.venv = gym.make_vec(
                self.env_id, num_envs=n, vectorization_mode="sync", vector_kwargs=vk, **self.kwargs
            )
        self.n = n

    def episode_seed(self, point: dict[str, int]) -> int:
        return episode_seed(self.seed, point)

    def snapshot(self) -> bytes:
        """The vector env (its envs' states and random generators) and the episodes' flags,
        pickled (checkpoints); an env that cannot be pickled raises ``RuntimeExecutionError``."""
        try:
            return pickle.dumps((self.venv, self.done, self.last_obs))
        except Exception as exc:  # noqa: BLE001 - any env object that does not pickle
            raise RuntimeExecutionError(
                f"env {self.env_id}: its state cannot be saved in a checkpoint ({type(exc).__name__}: "
                f"{exc}); checkpoint programs that reset it every iteration (episodic rollouts)"
            ) from exc

    def restore(self, snap: bytes) -> None:
        """Continue from :meth:`snapshot`'s value (a resumed run)."""
        venv, self.done, self.last_obs = pickle.loads(snap)
        if self.venv is not None and self.venv is not venv:
            self.venv.close()
        self.venv = venv

    def reset(self, point: dict[str, int]) -> np.ndarray:
        obs, _ = self.venv.reset(seed=self.episode_seed(point))
        self.done = np.zeros(self.n, dtype=bool)
        self.last_obs = np.asarray(obs)
        return self.last_obs if self.batched else self.last_obs[0]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.done is None or self.last_obs is None:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        if not self.batched:  # num_envs=1 without a batch dim: the vector env has 1 env
            action = np.asarray(action)[None]
        if self.autoreset:
            return self._step_autoreset(action)
        obs, rew, term, trunc, _ = self.venv.step(action)
        was_done = self.done
        obs = np.where(was_done.reshape((-1,) + (1,) * (np.ndim(obs) - 1)), self.last_obs, obs)
        rew = np.where(was_done, 0.0, rew).astype(np.float32)
        self.done = was_done | np.asarray(term) | np.asarray(trunc)
        self.last_obs = np.asarray(obs)
        if not self.batched:
            return self.last_obs[0], rew[0], self.done[0].copy()
        return self.last_obs, rew, self.done.copy()

    def _step_autoreset(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, rew, term, trunc, _ = self.venv.step(action)
        done = np.asarray(term) | np.asarray(trunc)
        if done.any() and not _same_step_mode(self.venv):
            obs = _reset_in_place(self.venv, done)
        obs = np.asarray(obs)
        rew = np.asarray(rew, dtype=np.float32)
        if not self.batched:
            return obs[0], rew[0], done[0].copy()
        return obs, rew, done


def episode_seed(seed: int, point: Mapping[str, int]) -> int:
    """The seed of the vector env's reset at ``point`` (env ``j`` of a synchronous vector env
    is seeded with it plus ``j``)."""
    return seed + 7919 * sum(point.values())


def _same_step_mode(venv: Any) -> bool:
    import gymnasium as gym

    return venv.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.SAME_STEP


def _resettable_in_place(venv: Any) -> bool:
    """gymnasium's NumPy ``CartPoleVectorEnv`` (``NEXT_STEP`` only): its state arrays are public."""
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    return isinstance(venv, CartPoleVectorEnv)


def _reset_in_place(venv: Any, done: np.ndarray) -> np.ndarray:
    """Reset the finished envs of a ``CartPoleVectorEnv`` now (what its next ``step`` would
    do in ``NEXT_STEP`` mode, with the same draw from its RNG) and return every env's obs."""
    k = int(done.sum())
    venv.state[:, done] = venv.np_random.uniform(low=venv.low, high=venv.high, size=(venv.state.shape[0], k))
    venv.steps[done] = 0
    venv.prev_done[done] = False
    return venv.state.T.astype(np.float32)


class _PerAgent:
    """One single-agent env state per agent (``make(seed)``, agent ``k`` with its own seed),
    stepped in turn; arrays cross as ``(B, S, ...)`` (host envs: NumPy)."""

    array_io = "numpy"

    def __init__(
        self, make: Callable[[int], Any], env_id: str, seed: int | Sequence[int], agents: Sym
    ) -> None:
        self.make = make
        self.env_id = env_id
        self.agents = agents
        self.seeds = agent_seeds(env_id, seed, agents)
        self.states: list[Any] = []

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.seeds = bind_agent_seeds(self.env_id, self.seeds, self.agents, bounds)
        if len(self.states) != len(self.seeds):
            self.states = [self.make(seed) for seed in self.seeds]
        for st in self.states:
            st.bind(bounds)

    def reset(self, point: dict[str, int]) -> np.ndarray:
        return np.stack([st.reset(point) for st in self.states], axis=1)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, ...]:
        outs = [st.step(action[:, k]) for k, st in enumerate(self.states)]
        return tuple(np.stack(xs, axis=1) for xs in zip(*outs, strict=True))

    def snapshot(self) -> list[Any]:
        """Every agent's env state (checkpoints)."""
        return [st.snapshot() for st in self.states]

    def restore(self, snap: list[Any]) -> None:
        """Continue from :meth:`snapshot`'s value."""
        for st, x in zip(self.states, snap, strict=True):
            st.restore(x)


class _Fn(UDFFn):
    def __init__(self, state: _GymState, kind: str) -> None:
        super().__init__(self._call, f"{state.env_id}.{kind}")
        self.state = state
        self.kind = kind
        # How arrays cross (see UDFFn): NumPy for gymnasium; a brax state exchanges jax arrays.
        self.array_io = getattr(state, "array_io", "numpy")

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.state.bind(bounds)

    def pure_step(self) -> Any:
        """The step's pure form for a scanned loop (:class:`timerl.runtime.scan.PureStep`),
        when the env family has one (JAX-native envs); None otherwise."""
        make = getattr(self.state, "pure_step", None)
        return make() if self.kind == "step" and make is not None else None

    def _call(self, inputs: list[np.ndarray], point: dict[str, int]) -> Sequence[np.ndarray]:
        if self.kind == "reset":
            return [self.state.reset(point)]
        return list(self.state.step(inputs[0]))


class GymEnv:
    """A gymnasium environment family usable in RT programs."""

    def __init__(
        self,
        env_id: str,
        num_envs: Any,
        seed: int | Sequence[int] = 0,
        autoreset: bool = False,
        agents: Sym | None = None,
        runners: Any = None,
        **kwargs: Any,
    ) -> None:
        import gymnasium as gym

        try:
            probe = gym.make(env_id, **kwargs)
        except gym.error.Error as exc:  # unknown id, version or namespace: say what ids look like
            raise TimeRLError(
                f"gymnasium cannot make {env_id!r}: {exc} Ids look like 'CartPole-v1' ('gym.CartPole-v1' "
                "in trl.env.make); other families take a prefix: 'brax.<name>', 'gymnax.<id>', "
                "'looptune.<dataset>', 'tiramisu.<set>'"
            ) from exc
        self.obs_space = probe.observation_space
        self.action_space = probe.action_space
        probe.close()
        self.autoreset = autoreset
        # runners (``timerl.dist.ray_runners(...)``): the envs live in remote runners; the
        # state they give has _GymState's methods, so the UDFs and the schedule stay the same
        self.runners: Any = None
        if runners is not None:
            if agents is not None:
                raise TimeRLError(f"env {env_id}: runners=... and agents=... cannot be combined yet")
            self.runners = runners.gym_state(
                env_id, num_envs, agent_seeds(env_id, seed, None)[0], kwargs, autoreset
            )
            state: Any = self.runners
        elif agents is None:
            state = _GymState(env_id, num_envs, agent_seeds(env_id, seed, None)[0], kwargs, autoreset)
        else:
            state = _PerAgent(
                lambda sd: _GymState(env_id, num_envs, sd, kwargs, autoreset), env_id, seed, agents
            )
        self._init_wrapper(env_id, num_envs, state, agents)

    def _init_wrapper(self, env_id: str, num_envs: Any, state: Any, agents: Sym | None = None) -> None:
        """The part shared with other env families (``BraxEnv``): ``state`` has ``bind``,
        ``reset(point)`` and ``step(action)``; ``obs_space``/``action_space`` are set.
        ``agents``: the bound of an agent dim (``trl.param(agents=...)``): the env holds
        ``B`` envs per agent, agent ``k``'s seeded as a one-agent env with its seed, and its
        arrays cross as ``(B, S, ...)``."""
        self.env_id = env_id
        self.ctx = current()
        if isinstance(num_envs, Sym):
            self.batch_dim: Sym | None = self.ctx.dim_of_bound(num_envs)
        else:
            self.batch_dim = None
            if int(num_envs) != 1:
                raise RTDefinitionError(
                    f"env {env_id}: num_envs must be the bound symbol of a batch dim (e.g. B) or 1"
                )
        self.agent_dim: Sym | None = None
        if agents is not None:
            if not isinstance(agents, Sym) or not agents.is_bound or self.batch_dim is None:
                raise RTDefinitionError(
                    f"env {env_id}: agents=... takes the bound symbol of the agent dim (e.g. S), with "
                    "num_envs the bound of the batch dim (B)"
                )
            self.agent_dim = self.ctx.dim_of_bound(agents)
        self._batch_dims = tuple(d for d in (self.batch_dim, self.agent_dim) if d is not None)
        self._state = state
        self._reset_node: Any = None
        self._reset_domain: tuple[Sym, ...] = ()
        self.obs_spec = space_spec(self.obs_space)
        self.act_spec = space_spec(self.action_space)

    def reset(self, domain: Sequence[Sym] = ()) -> RecurrentTensor:
        """Observations of a fresh episode at every point of ``domain`` (e.g. ``(b, i)``)."""
        dom = tuple(domain)
        missing = [d.name for d in self._batch_dims if not any(d is x for x in dom)]
        if missing:
            raise RTDefinitionError(
                f"env {self.env_id}: reset domain {tuple(d.name for d in dom)} must include the batch "
                f"dim(s) {', '.join(missing)}"
            )
        (obs,) = udf(
            _Fn(self._state, "reset"),
            [self.obs_spec],
            dom,
            name=f"{self.env_id}.reset",
            batch_dims=self._batch_dims,
        )
        self._mark_agents(obs)
        self._reset_node = obs.node
        self._reset_domain = obs.node.domain
        return obs

    def _action_mask_udf(self, fn: UDFFn, num_actions: int, obs: RecurrentTensor) -> RecurrentTensor:
        """A float32 ``(num_actions,)`` mask per point of ``obs``, computed by ``fn`` from the
        env's state after the step that made ``obs`` (for subclasses' ``action_mask``)."""
        (mask,) = udf(
            fn,
            [((num_actions,), DType.float32)],
            obs.domain,
            [obs],
            name=f"{self.env_id}.action_mask",
            batch_dims=self._batch_dims,
        )
        self._mark_agents(mask)
        return mask

    def _mark_agents(self, x: RecurrentTensor) -> None:
        """Record the agent dim on an env op (the vectorizer puts agent dims last)."""
        if self.agent_dim is not None:
            x.node.agents = (self.agent_dim,)

    def step(self, action: RecurrentTensor) -> tuple[RecurrentTensor, RecurrentTensor, RecurrentTensor]:
        """``(next_obs, reward, done)`` at the action's points (``done``: episode over)."""
        if self._reset_node is None:
            raise RTDefinitionError(f"env {self.env_id}: call env.reset(domain=...) before env.step(...)")
        want_shape, want_dt = self.act_spec
        if tuple(action.shape) != tuple(want_shape):
            raise RTDefinitionError(
                f"env {self.env_id}: action per-point shape {action.shape} does not match the "
                f"action space {self.action_space} (want {want_shape})"
            )
        if action.dtype is not want_dt:
            action = action.cast(want_dt)
        dom = action.domain
        time_dims = [s for s in dom if s not in self._reset_domain]
        autoreset = getattr(self, "autoreset", False)
        if not time_dims or (len(time_dims) != 1 and not autoreset):
            raise RTDefinitionError(
                f"env {self.env_id}: the action must vary over exactly one dim more than reset's "
                f"domain (the time dim); got {tuple(s.name for s in dom)} (with autoreset=True, "
                "over any dims beyond it, e.g. (b, i, t) after reset(domain=(b,)))"
            )
        t = time_dims[-1]
        specs = [self.obs_spec, ((), DType.float32), ((), DType.bool_)]
        obs, rew, done = udf(
            _Fn(self._state, "step"),
            specs,
            dom,
            [action],
            name=f"{self.env_id}.step",
            batch_dims=self._batch_dims,
        )
        self._mark_agents(obs)
        step_node = obs.node
        T = self.ctx.bound_of(t)
        # Effects are ordered: step t after step t-1; reset k after all steps of episode k-1.
        step_node.order_after.append(
            BInput(step_node.id, 0, tuple(s - 1 if s is t else s for s in dom), t > 0)
        )
        if autoreset:  # iteration i's first step after the last step of i - 1 (and so on outwards)
            for k, d in enumerate(time_dims[:-1]):
                later = time_dims[k + 1 :]
                phi = tuple(d - 1 if s is d else (self.ctx.bound_of(s) - 1 if s in later else s) for s in dom)
                cond = d > 0
                for s in later:
                    cond = cond & (s == 0)
                step_node.order_after.append(BInput(step_node.id, 0, phi, cond))
            return obs, rew, done
        ep = [s for s in self._reset_domain if not any(s is x for x in self._batch_dims)]
        if ep:
            outer = ep[-1]
            phi = tuple(Slice(lift(0), T) if s is t else (s - 1 if s is outer else s) for s in dom)
            self._reset_node.order_after.append(BInput(step_node.id, 0, phi, outer > 0))
        return obs, rew, done
