"""Training helpers for ``Model.train``: the Monte-Carlo Fisher training step and callbacks."""
from .mc_fisher import MCFisherTrainStep, sampled_label_loss
from .callbacks import RefreshMonitor

__all__ = ["MCFisherTrainStep", "sampled_label_loss", "RefreshMonitor"]
