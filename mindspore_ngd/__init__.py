"""mindspore_ngd: natural-gradient optimizers (K-FAC family) for MindSpore."""
import logging as _logging

from .optim import KFAC, SPNGD, THOR, NGDOptimizer, Policy, default_decay_filter
from .optim.guard import is_divergence
from .inspect import kronecker_factors
from .train import MCFisherTrainStep, RefreshMonitor

__version__ = "0.1.0"
__all__ = ["KFAC", "SPNGD", "THOR", "NGDOptimizer", "Policy", "default_decay_filter", "is_divergence", "kronecker_factors",
           "MCFisherTrainStep", "RefreshMonitor", "__version__"]

_logger = _logging.getLogger("mindspore_ngd")
if not _logger.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("[mindspore_ngd] %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(_logging.INFO)
    _logger.propagate = False
