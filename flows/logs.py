"""The stages' progress lines in the Prefect run's logs (the UI's log view), beside the terminal's bar.

Prefect's own loggers run at WARNING here (flows/__init__.py: its INFO lines would bury the
stages' output), so a progress line goes through a logger of its own, at INFO, that hands it to
Prefect's API handler alone: the terminal shows the bar, not the line a second time.
"""

from __future__ import annotations

import logging

_logger: logging.Logger | None = None


def _api_logger() -> logging.Logger:
    global _logger
    if _logger is None:
        from prefect.logging.handlers import APILogHandler

        _logger = logging.getLogger("prefect.flow_runs.progress")
        _logger.setLevel(logging.INFO)
        _logger.propagate = False  # not to the console: the bar is there already
        _logger.addHandler(APILogHandler())
    return _logger


def log_progress(line: str) -> None:
    """Send `line` to the current flow run's logs; nothing outside a flow run."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        run_logger = get_run_logger()
    except MissingContextError:
        return
    _api_logger().info(line, extra=run_logger.extra)
