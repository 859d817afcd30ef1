"""``DNNBuilder``: MLP policies whose parameters vary over a symbolic dim (``i``).

``DNNBuilder(domain=(i,)).from_env(env, hidden=[64, 64]).build()`` gives a policy:
a categorical head for ``Discrete`` action spaces, a Gaussian head (state-independent
log-std parameter) for ``Box`` spaces. ``dnn(obs)`` samples an action; afterwards
``dnn.log_prob(action)`` is the log-probability of that action under the same
forward pass (its activations are reused, not recomputed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from timerl.errors import RTDefinitionError
from timerl.pdg.ops import DType, OpKind
from timerl.rt.creation import param, rand, randn
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

    def __init__(self, domain: Sequence[Sym] = (), seed: int = 0) -> None:
        self.domain = tuple(domain)
        self.seed = seed
        self.obs_dim: int | None = None
        self.hidden: list[int] = [64, 64]
        self.head: str = "categorical"
        self.out_dim: int | None = None
        self.activation = "tanh"
        self.critic = False
        self.shared = False

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
        elif isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
            self.head, self.out_dim = "gaussian", int(act.shape[0])
        else:
            raise RTDefinitionError(
                f"DNNBuilder.from_env: action space {act} is not supported; use Discrete (categorical "
                "head) or a flat Box (Gaussian head)"
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

    def build(self) -> DNN:
        if self.obs_dim is None or self.out_dim is None:
            raise RTDefinitionError("DNNBuilder.build(): call from_env(...) first")
        return DNN(self)


class DNN:
    """An MLP policy; ``params`` lists its parameter RTs (domain ``builder.domain``)."""

    def __init__(self, b: DNNBuilder) -> None:
        rng = np.random.default_rng(b.seed)
        sizes = [b.obs_dim, *b.hidden, b.out_dim]
        self.head = b.head
        self.activation = b.activation
        self.domain = b.domain
        self.layers: list[tuple[RecurrentTensor, RecurrentTensor]] = []
        for k, (fi, fo) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            last = k == len(sizes) - 2
            w, bias = _init_linear(rng, int(fi), int(fo), 0.01 if last else math.sqrt(2))
            self.layers.append(
                (param(w, b.domain, name=f"dnn.w{k}"), param(bias, b.domain, name=f"dnn.b{k}"))
            )
        self.params: list[RecurrentTensor] = [p for layer in self.layers for p in layer]
        if self.head == "gaussian":
            self.log_std = param(np.zeros(b.out_dim, np.float32), b.domain, name="dnn.log_std")
            self.params.append(self.log_std)
        # value head: its own MLP, or one linear layer on the shared trunk
        self.critic_layers: list[tuple[RecurrentTensor, RecurrentTensor]] = []
        self.shared = b.shared
        if b.critic:
            vsizes = [b.hidden[-1], 1] if b.shared else [b.obs_dim, *b.hidden, 1]
            for k, (fi, fo) in enumerate(zip(vsizes[:-1], vsizes[1:], strict=True)):
                last = k == len(vsizes) - 2
                w, bias = _init_linear(rng, int(fi), int(fo), 1.0 if last else math.sqrt(2))
                self.critic_layers.append(
                    (param(w, b.domain, name=f"dnn.vw{k}"), param(bias, b.domain, name=f"dnn.vb{k}"))
                )
            self.params += [p for layer in self.critic_layers for p in layer]
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
        if self.shared:
            assert trunk is not None
            v = self._mlp(trunk, self.critic_layers)
        else:
            x = obs if obs.dtype is DType.float32 else obs.cast(DType.float32)
            v = self._mlp(x, self.critic_layers)
        return v.squeeze(-1)

    def __call__(self, obs: RecurrentTensor) -> RecurrentTensor:
        """Sample an action at every point of ``obs`` (remembering the forward pass)."""
        out, trunk = self._features(obs)
        self._last, self._last_obs, self._last_trunk = out, obs, trunk
        if self.head == "categorical":
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
        if self.head == "categorical":
            lp = log_softmax(out, -1)
            return _apply(OpKind.GATHER, [lp, action.cast(DType.int64)], action.shape, lp.dtype)
        std = self.log_std.exp()
        z = (action.detach() - out) / std
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> RecurrentTensor:
        if self._last is None:
            raise RTDefinitionError("dnn.entropy(): call dnn(obs) first")
        if self.head == "categorical":
            lp = log_softmax(self._last, -1)
            return -(lp.exp() * lp).sum(-1)
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

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
