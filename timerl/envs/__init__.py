"""Environments as UDF ops: ``trl.env.make("gym.<id>" | "brax.<name>" | "gymnax.<id>", num_envs=B)``."""

from timerl.envs.registry import make as make

__all__ = ["make"]
