"""mindspore_ngd: natural-gradient optimizers (K-FAC family) for MindSpore."""
from . import _log
from .optim import KFAC, SPNGD, THOR, NGDOptimizer, Policy, default_decay_filter
from .optim.divergence import is_divergence
from .inspect import kronecker_factors
from .capture.self_attention import SelfAttention
from .train import (ConvertModelUtils, DivergenceMonitor, MCFisherTrainStep, NGDTrainOneStepCell, RefreshMonitor,
                    TrainingGuard, thor)

__version__ = "0.2.0"
__all__ = ["KFAC", "SPNGD", "THOR", "NGDOptimizer", "Policy", "default_decay_filter", "is_divergence", "kronecker_factors",
           "MCFisherTrainStep", "NGDTrainOneStepCell", "RefreshMonitor", "DivergenceMonitor", "TrainingGuard", "thor",
           "ConvertModelUtils", "SelfAttention",
           "__version__"]


# The package logger is silent by default: WARNINGs reach stderr while the application configured no
# logging, INFO reports only with verbose=True or when the application configured logging at INFO.
_log.install()
