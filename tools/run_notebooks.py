"""Execute course notebooks top to bottom in place, so committed outputs come from a real run.

    python tools/run_notebooks.py                 # every notebook
    python tools/run_notebooks.py notebooks/01_nodes_and_gpus.ipynb

Runs each notebook in its own folder with the current environment's kernel, stores outputs and
execution counts, drops widget state (``metadata.widgets``) so files stay small, replaces a widget's
text fallback (``VBox(children=(HTML(value=…``, what static viewers such as GitHub show) with one line
saying what it is, records where the outputs were produced (``metadata.mgpu_run``: this machine's
hardware label, torch, Python, the date; the course website prints it on the notebook's page), and stops
at the first cell that raises. Prints each notebook's wall time.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import sys
import time

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: What a static viewer shows in place of a live widget (each widget cell also saves a picture or table).
WIDGET_TEXT = "[interactive widget: run the notebook to use it; a static copy is saved with this cell]"
#: Notebook metadata saying where the stored outputs were produced (tools/build_site.py shows it).
RUN_KEY = "mgpu_run"


def run_record() -> dict[str, str]:
    """Where a run happens: this machine's hardware label (as the notebooks' measured numbers name it),
    torch and Python versions, and today's date (UTC)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from mgpu_helpers.hardware import hardware_label

    return {
        "hardware": hardware_label(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
    }


def run(path: pathlib.Path, timeout: int = 600) -> float:
    """Execute one notebook in place; return its wall time in seconds."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=False,
    )
    start = time.monotonic()
    client.execute()
    elapsed = time.monotonic() - start
    nb.metadata.pop("widgets", None)
    nb.metadata[RUN_KEY] = run_record()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data and "text/plain" in data:
                data["text/plain"] = WIDGET_TEXT
    nbformat.write(nb, path)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    for path in paths:
        print(f"{path.name}: {run(path.resolve()):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
