"""Used by notebook 00 and ``python -m mgpu_helpers``. The course map: one entry per notebook, what
each does on CPU, one GPU and several GPUs, and which helper modules it imports; plus the package's
module table.

README.md shows both tables (unit tests keep them in step with this package, with the notebooks' real
imports and with the modules on disk; ``python tools/update_readme.py`` rewrites them). The data sits in
:mod:`~mgpu_helpers.course.catalogue`, the row type and install cells in
:mod:`~mgpu_helpers.course.notebook`, the tables in :mod:`~mgpu_helpers.course.tables`.
"""

from .catalogue import NOTEBOOKS
from .notebook import EXTRAS, REPO_ENV, REPO_SLUG, REPO_URL, Notebook, install_cell
from .tables import MODULES, course_map_markdown, modes_here, module_table_markdown, module_users

__all__ = [
    "EXTRAS",
    "MODULES",
    "NOTEBOOKS",
    "REPO_ENV",
    "REPO_SLUG",
    "REPO_URL",
    "Notebook",
    "course_map_markdown",
    "install_cell",
    "module_table_markdown",
    "module_users",
    "modes_here",
]
