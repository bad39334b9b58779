"""Training helpers for ``Model.train``: the training step with a lean graph, the Monte-Carlo Fisher
training step, callbacks (the refresh report, the loss-side divergence stop), and the models
repository's THOR flow (``thor``, ``ConvertModelUtils``)."""
from .lean_step import NGDTrainOneStepCell
from .mc_fisher import MCFisherTrainStep, sampled_label_loss
from .callbacks import RefreshMonitor, TrainingGuard
from .divergence import DivergenceMonitor, with_divergence_stops
from .thor_flow import ConvertModelUtils, thor

__all__ = ["NGDTrainOneStepCell", "MCFisherTrainStep", "sampled_label_loss", "RefreshMonitor", "DivergenceMonitor",
           "with_divergence_stops", "TrainingGuard", "thor", "ConvertModelUtils"]
