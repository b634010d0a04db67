"""Used by notebooks 06a and 06b, through every module of :mod:`mgpu_helpers.tuning`.

Ray, Ray Tune, Optuna and pandas are the package's optional ``tune`` extra: the modules here import
them only inside the functions that need them, through :func:`require`, whose error says how to
install them. Importing :mod:`mgpu_helpers.tuning` itself never imports Ray or Optuna.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: How to get the optional dependencies of notebooks 06a and 06b.
INSTALL_HINT = 'pip install "mgpu-course[tune]"  (or: pip install "ray[tune]" optuna pandas)'


def require(module: str, needed_for: str = "this function") -> ModuleType:
    """Import ``module`` (e.g. ``"ray.tune"``); if it is missing, raise saying how to install it.

    Raises:
        ModuleNotFoundError: naming the missing package and the ``pip install`` that brings it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module.split(".")[0]
        raise ModuleNotFoundError(
            f"{needed_for} needs {missing!r}, which cannot be imported here ({exc}). "
            f"Install notebooks 06a/06b's extra: {INSTALL_HINT}",
            name=missing,
        ) from exc


def require_installed(module: str, needed_for: str) -> None:
    """Like :func:`require`, without importing ``module`` (for a command that runs in a child process)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ModuleNotFoundError(
            f"{needed_for} needs {module!r}, which is not installed here. "
            f"Install notebooks 06a/06b's extra: {INSTALL_HINT}",
            name=module,
        )
