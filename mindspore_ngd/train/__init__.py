"""Training helpers for ``Model.train``: the training step with a lean graph, the Monte-Carlo Fisher
training step and callbacks."""
from .lean_step import NGDTrainOneStepCell
from .mc_fisher import MCFisherTrainStep, sampled_label_loss
from .callbacks import RefreshMonitor

__all__ = ["NGDTrainOneStepCell", "MCFisherTrainStep", "sampled_label_loss", "RefreshMonitor"]
