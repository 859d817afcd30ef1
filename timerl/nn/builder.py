"""``DNNBuilder``: MLP policies whose parameters vary over a symbolic dim (``i``).

``DNNBuilder(domain=(i,)).from_env(env, hidden=[64, 64]).build()`` gives a policy:
a categorical head for ``Discrete`` action spaces, one categorical head per entry for flat
``MultiDiscrete`` spaces whose entries all have ``n`` choices (independent choices: the
log-probability and entropy are sums over the entries), a Gaussian head (state-independent
log-std parameter) for ``Box`` spaces. ``dnn(obs)`` samples an action; afterwards
``dnn.log_prob(action)`` is the log-probability of that action under the same
forward pass (its activations are reused, not recomputed).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timerl.errors import RTDefinitionError
from timerl.pdg.ops import DType, OpKind
from timerl.rt.creation import param as _param
from timerl.rt.creation import rand, randn
from timerl.rt.tensor import RecurrentTensor, _apply, log_softmax
from timerl.symbolic import Sym


def _init_linear(
    rng: np.random.Generator, fan_in: int, fan_out: int, gain: float
) -> tuple[np.ndarray, np.ndarray]:
    a = rng.standard_normal((max(fan_in, fan_out), min(fan_in, fan_out)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    w = q if fan_in >= fan_out else q.T
    return (gain * w[:fan_in, :fan_out]).astype(np.float32), np.zeros(fan_out, np.float32)


class DNNBuilder:
    """Configure an MLP policy; see the module docstring."""

    def __init__(
        self,
        domain: Sequence[Sym] = (),
        seed: int = 0,
        seeds: Sequence[int] | None = None,
        agents: Sequence[Sym] = (),
    ) -> None:
        """``domain``: the parameters' dims (``(i,)``). ``seeds`` and ``agents``: one network
        per seed along the agent dim (``domain=(i, s), agents=(s,), seeds=[0, 1, 2]``: three
        agents trained in one program, agent ``k`` initialised as ``DNNBuilder(domain=(i,),
        seed=seeds[k])`` would be; see ``trl.param(agents=...)``)."""
        self.domain = tuple(domain)
        self.seed = seed
        self.seeds = None if seeds is None else [int(x) for x in seeds]
        self.agents = tuple(agents)
        if (
            (self.seeds is None) != (not self.agents)
            or (self.seeds is not None and not self.seeds)
            or len(self.agents) > 1
        ):
            raise RTDefinitionError(
                "DNNBuilder(seeds=..., agents=...): give both, one seed per agent along one agent dim of "
                "the domain, e.g. DNNBuilder(domain=(i, s), agents=(s,), seeds=[0, 1, 2])"
            )
        self.obs_dim: int | None = None
        self.hidden: list[int] = [64, 64]
        self.head: str = "categorical"
        self.out_dim: int | None = None
        self.choices = 0  # multi-categorical: choices per action entry
        self.activation = "tanh"
        self.critic = False
        self.shared = False
        self.weights: dict[str, Any] = {}

    def from_env(
        self,
        env: Any,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        critic: bool = False,
        shared: bool = False,
    ) -> DNNBuilder:
        """Size the network from ``env``'s spaces.

        ``critic=True`` adds a value head (``dnn.value()``): a separate MLP of the same
        hidden sizes, or with ``shared=True`` one linear layer on the policy's last hidden
        layer (actor and critic then share the trunk).
        """
        import gymnasium as gym

        obs = env.obs_space
        act = env.action_space
        if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
            raise RTDefinitionError(f"DNNBuilder.from_env: needs a flat Box observation space, got {obs}")
        self.obs_dim = int(obs.shape[0])
        if isinstance(act, gym.spaces.Discrete):
            self.head, self.out_dim = "categorical", int(act.n)
        elif (
            isinstance(act, gym.spaces.MultiDiscrete)
            and len(act.nvec.shape) == 1
            and len(set(int(n) for n in act.nvec)) == 1
        ):
            self.head, self.choices = "multi_categorical", int(act.nvec[0])
            self.out_dim = int(act.nvec.shape[0]) * self.choices
        elif isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
            self.head, self.out_dim = "gaussian", int(act.shape[0])
        else:
            raise RTDefinitionError(
                f"DNNBuilder.from_env: action space {act} is not supported; use Discrete (categorical "
                "head), a flat MultiDiscrete with equal choices (one categorical head per entry) or a "
                "flat Box (Gaussian head)"
            )
        self.hidden = list(hidden)
        self.activation = activation
        self.critic = critic
        self.shared = shared
        if shared and not critic:
            raise RTDefinitionError("DNNBuilder.from_env: shared=True needs critic=True")
        if shared and not self.hidden:
            raise RTDefinitionError("DNNBuilder.from_env: a shared trunk needs at least one hidden layer")
        return self

    def build(self, weights: Mapping[str, Any] | None = None) -> DNN:
        """The network; ``weights`` (e.g. from a checkpoint: ``{"dnn.w0": array, ...}``)
        replaces the random initial values of the parameters it names."""
        if self.obs_dim is None or self.out_dim is None:
            raise RTDefinitionError("DNNBuilder.build(): call from_env(...) first")
        self.weights = dict(weights or {})
        return DNN(self)


class DNN:
    """An MLP policy; ``params`` lists its parameter RTs (domain ``builder.domain``)."""

    def __init__(self, b: DNNBuilder) -> None:
        # one generator per agent (b.seeds), each drawing what a one-agent network would
        rngs = [np.random.default_rng(x) for x in (b.seeds if b.seeds is not None else [b.seed])]
        agents = b.agents
        weights = dict(b.weights)

        def init_linear(fan_in: int, fan_out: int, gain: float) -> tuple[np.ndarray, np.ndarray]:
            pairs = [_init_linear(rng, fan_in, fan_out, gain) for rng in rngs]
            if not agents:
                return pairs[0]
            return np.stack([w for w, _ in pairs]), np.stack([x for _, x in pairs])

        def param(init: np.ndarray, domain: Any, name: str) -> RecurrentTensor:
            if name in weights:
                got = np.asarray(weights.pop(name), dtype=np.float32)
                if agents and got.shape == init.shape[1:]:  # one network's weights: every agent's
                    got = np.broadcast_to(got, init.shape).copy()
                if got.shape != init.shape:
                    raise RTDefinitionError(
                        f"DNNBuilder.build(weights=...): {name} has shape {got.shape}, the network "
                        f"needs {init.shape}; build with the hidden sizes the weights were trained with"
                    )
                init = got
            return _param(init, domain, name=name, agents=agents)

        sizes = [b.obs_dim, *b.hidden, b.out_dim]
        self.head = b.head
        self.choices = b.choices
        self.activation = b.activation
        self.domain = b.domain
        self.agents = b.agents
        self.layers: list[tuple[RecurrentTensor, RecurrentTensor]] = []
        for k, (fi, fo) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            last = k == len(sizes) - 2
            w, bias = init_linear(int(fi), int(fo), 0.01 if last else math.sqrt(2))
            self.layers.append(
                (param(w, b.domain, name=f"dnn.w{k}"), param(bias, b.domain, name=f"dnn.b{k}"))
            )
        self.params: list[RecurrentTensor] = [p for layer in self.layers for p in layer]
        if self.head == "gaussian":
            zero = np.zeros((len(rngs), b.out_dim) if agents else b.out_dim, np.float32)
            self.log_std = param(zero, b.domain, name="dnn.log_std")
            self.params.append(self.log_std)
        # value head: its own MLP, or one linear layer on the shared trunk
        self.critic_layers: list[tuple[RecurrentTensor, RecurrentTensor]] = []
        self.shared = b.shared
        if b.critic:
            vsizes = [b.hidden[-1], 1] if b.shared else [b.obs_dim, *b.hidden, 1]
            for k, (fi, fo) in enumerate(zip(vsizes[:-1], vsizes[1:], strict=True)):
                last = k == len(vsizes) - 2
                w, bias = init_linear(int(fi), int(fo), 1.0 if last else math.sqrt(2))
                self.critic_layers.append(
                    (param(w, b.domain, name=f"dnn.vw{k}"), param(bias, b.domain, name=f"dnn.vb{k}"))
                )
            self.params += [p for layer in self.critic_layers for p in layer]
        if weights:
            raise RTDefinitionError(
                f"DNNBuilder.build(weights=...): no parameter named {sorted(weights)} in this network "
                f"(it has {[p.name for p in self.params]})"
            )
        self._last: RecurrentTensor | None = None
        self._last_obs: RecurrentTensor | None = None
        self._last_trunk: RecurrentTensor | None = None

    def _mlp(
        self, x: RecurrentTensor, layers: list[tuple[RecurrentTensor, RecurrentTensor]]
    ) -> RecurrentTensor:
        for k, (w, bias) in enumerate(layers):
            x = x @ w + bias
            if k < len(layers) - 1:
                x = x.tanh() if self.activation == "tanh" else x.relu()
        return x

    def _features(self, obs: RecurrentTensor) -> tuple[RecurrentTensor, RecurrentTensor]:
        """(policy output, last hidden layer) at every point of ``obs``."""
        x = obs if obs.dtype is DType.float32 else obs.cast(DType.float32)
        x = self._mlp(x, self.layers[:-1])
        if len(self.layers) > 1:
            x = x.tanh() if self.activation == "tanh" else x.relu()
        w, bias = self.layers[-1]
        return x @ w + bias, x

    def forward(self, obs: RecurrentTensor) -> RecurrentTensor:
        """The network output (logits or Gaussian mean) at every point of ``obs``."""
        return self._features(obs)[0]

    def value(self, obs: RecurrentTensor | None = None) -> RecurrentTensor:
        """The critic's value (per-point shape ``()``) of ``obs``, default the last acted-on obs.

        Without ``obs`` the last forward pass is reused (its activations, with a shared trunk).
        """
        if not self.critic_layers:
            raise RTDefinitionError("dnn.value(): build the network with from_env(..., critic=True)")
        if obs is None:
            if self._last_obs is None:
                raise RTDefinitionError("dnn.value(): call dnn(obs) first or pass obs=...")
            obs, trunk = self._last_obs, self._last_trunk
        else:
            trunk = self._features(obs)[1] if self.shared else None
        return self._critic(obs, trunk)

    def _critic(self, obs: RecurrentTensor, trunk: RecurrentTensor | None) -> RecurrentTensor:
        """The value head on the shared trunk's last hidden layer, or its own MLP on ``obs``."""
        if self.shared:
            assert trunk is not None
            return self._mlp(trunk, self.critic_layers).squeeze(-1)
        x = obs if obs.dtype is DType.float32 else obs.cast(DType.float32)
        return self._mlp(x, self.critic_layers).squeeze(-1)

    def __call__(self, obs: RecurrentTensor) -> RecurrentTensor:
        """Sample an action at every point of ``obs`` (remembering the forward pass)."""
        out, trunk = self._features(obs)
        self._last, self._last_obs, self._last_trunk = out, obs, trunk
        if self.head == "multi_categorical":
            out = self._split(out)
        if self.head in ("categorical", "multi_categorical"):
            u = rand(out.shape, out.domain)
            gumbel = -(-(u + 1e-10).log() + 1e-10).log()  # Gumbel-max trick
            return (out + gumbel).argmax(-1)
        noise = randn(out.shape, out.domain)
        return out + self.log_std.exp() * noise

    def log_prob(self, action: RecurrentTensor, obs: RecurrentTensor | None = None) -> RecurrentTensor:
        """Log-probability of ``action`` under the last forward pass (or under ``obs``)."""
        out = self.forward(obs) if obs is not None else self._last
        if out is None:
            raise RTDefinitionError("dnn.log_prob(a): call dnn(obs) first or pass obs=...")
        return self._log_prob(out, action)

    def entropy(self) -> RecurrentTensor:
        if self._last is None:
            raise RTDefinitionError("dnn.entropy(): call dnn(obs) first")
        return self._entropy(self._last)

    def evaluate(
        self, obs: RecurrentTensor, action: RecurrentTensor
    ) -> tuple[RecurrentTensor, RecurrentTensor, RecurrentTensor | None]:
        """``(log_prob(action), entropy, value)`` from one new forward pass over ``obs``.

        What PPO's later epochs need: the policy re-evaluated with the current parameters
        on stored observations (``value`` is None without a critic).
        """
        out, trunk = self._features(obs)
        value = self._critic(obs, trunk) if self.critic_layers else None
        return self._log_prob(out, action), self._entropy(out), value

    def _split(self, out: RecurrentTensor) -> RecurrentTensor:
        """Multi-categorical logits ``(entries * n,)`` as ``(entries, n)``."""
        return out.reshape((*out.shape[:-1], out.shape[-1] // self.choices, self.choices))

    def _log_prob(self, out: RecurrentTensor, action: RecurrentTensor) -> RecurrentTensor:
        if self.head == "multi_categorical":
            lp = log_softmax(self._split(out), -1)
            return _apply(OpKind.GATHER, [lp, action.cast(DType.int64)], action.shape, lp.dtype).sum(-1)
        if self.head == "categorical":
            lp = log_softmax(out, -1)
            return _apply(OpKind.GATHER, [lp, action.cast(DType.int64)], action.shape, lp.dtype)
        std = self.log_std.exp()
        z = (action.detach() - out) / std
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def _entropy(self, out: RecurrentTensor) -> RecurrentTensor:
        if self.head == "multi_categorical":
            lp = log_softmax(self._split(out), -1)
            return -(lp.exp() * lp).sum(-1).sum(-1)
        if self.head == "categorical":
            lp = log_softmax(out, -1)
            return -(lp.exp() * lp).sum(-1)
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def at(self, *index: Any) -> DNN:
        """The same network with every parameter read at ``index`` (e.g. ``dnn.at(i, 0)``).

        For parameters over more dims than the caller's points, such as ``(i, e)`` when
        PPO updates once per epoch ``e``: acting at ``(b, i, t)`` uses the parameters
        at the start of iteration ``i`` with ``dnn.at(i, 0)``. ``params`` stays the full
        list (what the optimiser updates); the view shares nothing else with ``self``.
        With agent dims (``DNNBuilder(agents=...)``) the index may leave them out: each agent
        reads its own parameters.
        """
        upd = [d for d in self.domain if not any(d is a for a in self.agents)]
        if self.agents and len(index) == len(upd):
            it = iter(index)
            index = tuple(d if any(d is a for a in self.agents) else next(it) for d in self.domain)
        if len(index) != len(self.domain):
            raise RTDefinitionError(
                f"dnn.at{index}: give one index per parameter dim {tuple(s.name for s in self.domain)}"
            )
        view = copy.copy(self)
        view.layers = [(w[index], bias[index]) for w, bias in self.layers]
        view.critic_layers = [(w[index], bias[index]) for w, bias in self.critic_layers]
        if self.head == "gaussian":
            view.log_std = self.log_std[index]
        view._last = view._last_obs = view._last_trunk = None
        return view

    def __getitem__(self, cond: Any) -> _DNNView:
        return _DNNView(self, cond)

    def checkpoint(self, path: str, config: dict[str, Any] | None = None) -> None:
        _DNNView(self, None).checkpoint(path, config)


class _DNNView:
    def __init__(self, dnn: DNN, cond: Any) -> None:
        self.dnn = dnn
        self.cond = cond

    def checkpoint(self, path: str, config: dict[str, Any] | None = None) -> None:
        """One checkpoint of the whole program (not only these params) where ``cond`` holds."""
        for p in self.dnn.params:
            (p if self.cond is None else p[self.cond]).checkpoint(path, config)
