"""mindspore_ngd: natural-gradient optimizers (K-FAC family) for MindSpore."""
import logging as _logging
import sys as _sys

from .optim import KFAC, SPNGD, THOR, NGDOptimizer, Policy, default_decay_filter
from .optim.guard import is_divergence
from .inspect import kronecker_factors
from .train import ConvertModelUtils, MCFisherTrainStep, NGDTrainOneStepCell, RefreshMonitor, thor

__version__ = "0.2.0"
__all__ = ["KFAC", "SPNGD", "THOR", "NGDOptimizer", "Policy", "default_decay_filter", "is_divergence", "kronecker_factors",
           "MCFisherTrainStep", "NGDTrainOneStepCell", "RefreshMonitor", "thor", "ConvertModelUtils",
           "__version__"]


class _FallbackHandler(_logging.Handler):
    """Prints the package's records to stderr, prefixed ``[mindspore_ngd]``, only while no handler
    above the package logger would take them (the application configured no logging). Once the
    application configures logging (``logging.basicConfig``, a framework, pytest's caplog), the
    records propagate to its handlers and this one stays silent: no duplicates."""

    def emit(self, record):
        logger = _logging.getLogger("mindspore_ngd")
        parent = logger.parent if logger.propagate else None
        while parent is not None:
            if parent.handlers:
                return
            parent = parent.parent if parent.propagate else None
        try:
            _sys.stderr.write(self.format(record) + "\n")      # the stderr of the moment, as logging.lastResort
        except Exception:  # noqa: BLE001 -- logging's own contract: report, never raise
            self.handleError(record)


# The package logger propagates like any library logger; its level INFO keeps the optimizers'
# one-line layer reports visible by default (set it to WARNING, or pass verbose=False, to hide them).
_logger = _logging.getLogger("mindspore_ngd")
if not any(isinstance(h, _FallbackHandler) for h in _logger.handlers):
    _handler = _FallbackHandler()
    _handler.setFormatter(_logging.Formatter("[mindspore_ngd] %(levelname)s %(message)s"))
    _logger.addHandler(_handler)
    if _logger.level == _logging.NOTSET:
        _logger.setLevel(_logging.INFO)
