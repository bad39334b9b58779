"""The package logger ``"mindspore_ngd"`` and its one policy: silent by default.

The logger has level NOTSET (it follows the application's configuration, root's WARNING when
nothing is configured) and one fallback handler, level WARNING, that prints a record to stderr with
a ``[mindspore_ngd]`` prefix only while no handler above it would take the record (as Python's
last-resort handler would). So, with no logging configured, WARNINGs show and INFO lines do not;
once the application configures logging, records propagate to its handlers at its levels.

:func:`info` carries the optional reports (the layer report at construction, RefreshMonitor's
epoch line). Their ``verbose`` argument: ``None`` (the default) logs at INFO, shown only when the
application configured logging at INFO; ``True`` always shows the line (on the configured handlers
when they take INFO, otherwise on stderr with the prefix); ``False`` never logs it.
"""
import logging
import sys

logger = logging.getLogger("mindspore_ngd")
PREFIX = "[mindspore_ngd] %(levelname)s %(message)s"


def _configured(log):
    """True if a handler above ``log`` (the application's, not the package's fallback) exists."""
    parent = log.parent if log.propagate else None
    while parent is not None:
        if parent.handlers:
            return True
        parent = parent.parent if parent.propagate else None
    return False


class FallbackHandler(logging.Handler):
    """Prints the package's records to stderr, prefixed ``[mindspore_ngd]``, only while no handler
    above the package logger would take them (the application configured no logging). Once the
    application configures logging (``logging.basicConfig``, a framework, pytest's caplog), the
    records propagate to its handlers and this one stays silent: no duplicates."""

    def emit(self, record):
        if _configured(logging.getLogger("mindspore_ngd")):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")      # the stderr of the moment, as logging.lastResort
        except Exception:  # noqa: BLE001 -- logging's own contract: report, never raise
            self.handleError(record)


def install():
    """Idempotent: the fallback handler (level WARNING) on the package logger, whose level stays as
    the application set it (NOTSET by default)."""
    for h in logger.handlers:
        if isinstance(h, FallbackHandler):
            h.setLevel(logging.WARNING)
            return
    handler = FallbackHandler(logging.WARNING)
    handler.setFormatter(logging.Formatter(PREFIX))
    logger.addHandler(handler)


def info(verbose, msg, *args):
    """Log an optional report line (see the module docstring for ``verbose``)."""
    if verbose is False:
        return
    if logger.isEnabledFor(logging.INFO) and _configured(logger):
        logger.info(msg, *args)
    elif verbose:
        sys.stderr.write("[mindspore_ngd] INFO " + (msg % args if args else msg) + "\n")
