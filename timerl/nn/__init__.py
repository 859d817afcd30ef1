"""Neural-network modules written as RTs."""

from timerl.nn.builder import DNN as DNN
from timerl.nn.builder import DNNBuilder as DNNBuilder

__all__ = ["DNN", "DNNBuilder"]
