"""Optimisers written as RTs: ``w[i + 1] = update(w[i], grad[i])``."""

from timerl.optim.optimizers import SGD as SGD
from timerl.optim.optimizers import Adam as Adam

__all__ = ["SGD", "Adam"]
