"""A trained LoopTune policy in plain NumPy: load a checkpoint, pick actions greedily.

The policy network of ``examples/ppo_looptune.py`` (``DNNBuilder.from_env(env, hidden=[h,
h], critic=True)``: ``tanh`` MLP, parameters ``dnn.w0, dnn.b0, ...``) saved by its
checkpoint, or the Q-network of ``examples/dqn_looptune.py`` (``relu``; its greedy
policy is the argmax of the Q-values), saved as ``policy.npz`` (:meth:`Policy.save`).
:meth:`Policy.load` reads the latest parameters of a checkpoint (a ``ckpt_<i>.npz``/
``.json`` file, a checkpoint folder, or a run folder holding ``checkpoints/``) or a
``policy.npz`` (or a run folder holding one); :meth:`Policy.rollout` plays a greedy episode over the actions that
change the nest (an argmax on a no-op would repeat it: the state stays the same).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from timerl.envs.looptune.ir import (
    ACTIONS,
    MAX_LOOPS,
    NUM_FEATURES,
    LoopState,
    apply_action,
    features,
    is_valid,
)
from timerl.errors import TimeRLError


@dataclass(frozen=True)
class Policy:
    """The actor MLP: ``layers[k] = (w, b)``; ``activation`` (``tanh`` or ``relu``)
    between layers, logits (or Q-values) out."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    max_loops: int = MAX_LOOPS
    source: str = ""
    activation: str = "tanh"

    def __post_init__(self) -> None:
        if not self.layers:
            raise TimeRLError("a LoopTune policy needs at least one layer")
        if self.activation not in ("tanh", "relu"):
            raise TimeRLError(f"policy activation must be tanh or relu, got {self.activation!r}")
        obs_dim = self.layers[0][0].shape[0]
        if obs_dim != self.max_loops * NUM_FEATURES or self.layers[-1][0].shape[1] != len(ACTIONS):
            raise TimeRLError(
                f"policy {self.source or ''} maps {obs_dim} inputs to {self.layers[-1][0].shape[1]} actions; "
                f"a LoopTune policy maps {self.max_loops} x {NUM_FEATURES} features to {len(ACTIONS)} actions"
            )

    @classmethod
    def from_weights(
        cls, weights: Mapping[str, np.ndarray], source: str = "", activation: str = "tanh"
    ) -> Policy:
        """From ``{"dnn.w0": ..., "dnn.b0": ..., ...}`` (the critic ``dnn.v*`` is ignored)."""
        layers = []
        k = 0
        while f"dnn.w{k}" in weights:
            w = np.asarray(weights[f"dnn.w{k}"], np.float32)
            b = np.asarray(weights.get(f"dnn.b{k}", np.zeros(w.shape[1])), np.float32)
            layers.append((w, b))
            k += 1
        if not layers:
            raise TimeRLError(f"no policy parameters (dnn.w0, dnn.b0, ...) in {source or 'the weights'}")
        obs_dim = layers[0][0].shape[0]
        if obs_dim % NUM_FEATURES:
            raise TimeRLError(
                f"policy {source}: {obs_dim} inputs is not a multiple of {NUM_FEATURES} features"
            )
        return cls(tuple(layers), obs_dim // NUM_FEATURES, source, activation)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``dnn.w0, dnn.b0, ...`` and the activation to ``path`` (a ``.npz``)."""
        arrays: dict[str, np.ndarray] = {"activation": np.array(self.activation)}
        for k, (w, b) in enumerate(self.layers):
            arrays[f"dnn.w{k}"], arrays[f"dnn.b{k}"] = w, b
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out, **arrays)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """The latest parameters of a checkpoint: a ``ckpt_<i>`` file, a folder of them, or a
        run folder (``runs/ppo_looptune``) with a ``checkpoints/`` folder."""
        from timerl.runtime.checkpoint import read_values

        p = Path(path)
        if p.is_dir() and (p / "policy.npz").is_file():
            p = p / "policy.npz"
        if p.is_file() and p.name.endswith(".npz") and not p.name.startswith("ckpt_"):
            try:
                with np.load(p, allow_pickle=False) as z:
                    arrays = {k: z[k] for k in z.files}
            except (OSError, ValueError) as exc:
                raise TimeRLError(f"cannot read the LoopTune policy {p}: {exc}") from exc
            act = str(arrays.pop("activation", "tanh"))
            return cls.from_weights(arrays, str(path), act)
        if p.is_dir() and (p / "checkpoints").is_dir():
            p = p / "checkpoints"
        if not p.exists():
            raise TimeRLError(
                f"no LoopTune policy at {path}: pass a checkpoint file or folder (runs/ppo_looptune)"
            )
        values = read_values(str(p))
        latest = {name: pts[max(pts)] for name, pts in values.items() if name.startswith("dnn.")}
        return cls.from_weights(latest, str(path))

    def logits(self, state: LoopState) -> np.ndarray:
        """The action logits for ``state``."""
        x = features(state, self.max_loops).reshape(-1)
        for k, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if k < len(self.layers) - 1:
                x = np.tanh(x) if self.activation == "tanh" else np.maximum(x, 0.0)
        return x

    def act(self, state: LoopState) -> int:
        """The best action that changes ``state`` (every action is a no-op: ``up``)."""
        logits = self.logits(state)
        valid = [a for a in range(len(ACTIONS)) if is_valid(state, a, self.max_loops)]
        return max(valid, key=lambda a: logits[a]) if valid else 0

    def rollout(self, state: LoopState, steps: int = 10) -> tuple[list[LoopState], list[int]]:
        """A greedy episode of ``steps`` actions: its states (``state`` first) and actions."""
        states, actions = [state], []
        for _ in range(steps):
            actions.append(self.act(states[-1]))
            states.append(apply_action(states[-1], actions[-1], self.max_loops))
        return states, actions
