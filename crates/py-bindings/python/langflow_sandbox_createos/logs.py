"""Where the package's log records go when the host application routes none of them.

The native extension hands its records (each run's ``createos <surface> run in guest ...``
line among them) to the standard-library logger ``langflow_sandbox_createos``. Langflow routes
standard logging into its own log, but ``lfx run`` configures only lfx's own logger (structlog,
on stderr, at INFO with ``-v`` and DEBUG with ``-vv``), so records of other loggers fell through
to Python's last-resort handler, which shows warnings only. :func:`route_to_lfx` closes that
gap, and only that one: while no handler anywhere would take the package's records, INFO and
above are printed on standard error once ``lfx run`` was given any ``-v``, and nothing without. It changes nothing where logging is
configured (Langflow, an application with its own handlers).
"""

from __future__ import annotations

import logging
import sys

__all__ = ["route_to_lfx"]

_NAME = "langflow_sandbox_createos"


def _lfx_level() -> int:
    """The lowest level lfx's logger prints (``lfx run``: INFO with ``-v``, DEBUG with ``-vv``),
    or CRITICAL when it cannot be read."""
    try:
        import structlog

        level = getattr(structlog.get_config().get("wrapper_class"), "min_level", logging.CRITICAL)
    except Exception:  # noqa: BLE001 - no structlog, or a configuration of another shape
        return logging.CRITICAL
    return level if isinstance(level, int) else logging.CRITICAL


def _threshold() -> int:
    """The lowest level printed: INFO once lfx's logger is below CRITICAL, else nothing.

    ``lfx run`` leaves its logger at CRITICAL without ``-v`` and lowers it with any ``-v``
    (while the graph runs, ``-v`` reads as ERROR: lfx quiets its own loader), so any ``-v``
    is the request to see what ran where.
    """
    return logging.INFO if _lfx_level() < logging.CRITICAL else logging.CRITICAL + 1


class _ToLfx(logging.Handler):
    """Prints a record at lfx's level on the process's real standard error, unless another
    handler took over since it was added.

    Not through lfx's logger itself: ``lfx run`` swaps ``sys.stderr`` for a buffer while the
    graph runs and prints none of it, its own log lines included.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or record.levelno < _threshold():
            return  # the application handles logging after all, or lfx run was not asked to talk
        try:
            stream = sys.__stderr__
            if stream is not None:
                stream.write(f"[{record.levelname.lower():<8}] {_NAME}: {record.getMessage()}\n")
                stream.flush()
        except Exception:  # noqa: BLE001 - a log record must never fail a run
            self.handleError(record)


def route_to_lfx() -> None:
    """Send the package's records to lfx's logger while nothing else would handle them.

    Idempotent. Where it applies, the logger's level is set to INFO when it has none of its
    own, so that each run's INFO line reaches lfx's level check (``lfx run`` without ``-v``
    prints none of it; with ``-v`` the run lines show).
    """
    ours = logging.getLogger(_NAME)
    if any(isinstance(h, _ToLfx) for h in ours.handlers) or ours.hasHandlers():
        return
    ours.addHandler(_ToLfx())
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)
