"""Pretend that some packages are not installed: ``bash tools/gpu_check.sh --without ray,sklearn`` (or
``GPU_CHECK_WITHOUT=ray,sklearn`` with this folder on PYTHONPATH) runs the check as a machine without
them would, in every Python process it starts (notebook kernels and test subprocesses included).

Python imports ``sitecustomize`` at start-up. This one wraps each import finder so that it finds
neither the named top-level modules (``import ray`` raises "No module named 'ray'";
``importlib.util.find_spec("ray")`` returns None) nor their distributions' metadata, and then runs the
next ``sitecustomize`` on sys.path, if any.
"""

import importlib.machinery
import importlib.util
import os
import re
import sys

HIDDEN = set(os.environ.get("GPU_CHECK_WITHOUT", "").replace(",", " ").split())
#: Distributions whose name differs from their module's.
_DISTRIBUTIONS = {"sklearn": "scikit-learn", "yaml": "pyyaml", "PIL": "pillow", "ray": "ray"}
_HIDDEN_DISTRIBUTIONS = {re.sub(r"[-_.]+", "-", _DISTRIBUTIONS.get(m, m)).lower() for m in HIDDEN}


class _Hiding:
    """A finder that defers to ``inner`` except for the hidden modules and distributions."""

    def __init__(self, inner):
        self._inner = inner

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self._inner, "find_spec", None)
        return find(fullname, path, target) if find is not None else None

    def find_distributions(self, *args, **kwargs):
        find = getattr(self._inner, "find_distributions", None)
        if find is None:
            return iter(())
        return (
            d
            for d in find(*args, **kwargs)
            if re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() not in _HIDDEN_DISTRIBUTIONS
        )

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if HIDDEN:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
_chain()
