"""LoopTune for users: tune a matmul with a trained policy (:func:`tune`), load a policy
(:meth:`Policy.load`). The environment itself is :mod:`timerl.envs.looptune`."""

from timerl.looptune.policy import Policy
from timerl.looptune.tuning import TuneResult, parse_einsum, tune

__all__ = ["Policy", "TuneResult", "parse_einsum", "tune"]
