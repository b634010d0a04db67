"""Rewrite what is generated from ``mgpu_helpers.course`` (tests fail when it differs):

* README.md's course-map and module tables;
* every notebook's badge line ("Open in Colab", "Open in Kaggle") in its first cell;
* every notebook's first code cell, the install cell (from ``REPO_URL`` and the notebook's extra).

    python tools/update_readme.py

Publishing the course under another repository: change ``REPO_URL``/``REPO_SLUG`` in
``mgpu_helpers/course/notebook.py``, then run this.
"""

from __future__ import annotations

import pathlib
import re

import nbformat

from mgpu_helpers.course import NOTEBOOKS, course_map_markdown, module_table_markdown

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BADGE_LINE = re.compile(r"^\[!\[Open In Colab\].*$", flags=re.M)


def update_readme() -> None:
    text = README.read_text()
    for head, table in (("| # | Notebook |", course_map_markdown()), ("| module |", module_table_markdown())):
        pattern = re.compile("^" + re.escape(head) + r".*?(?=\n\n)", flags=re.S | re.M)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no table starting with a line '{head}'")
        text = pattern.sub(lambda _, table=table: table, text, count=1)
    README.write_text(text)


def update_notebooks() -> list[str]:
    """Badge line and install cell of every notebook on disk; returns the files that changed."""
    changed = []
    for entry in NOTEBOOKS:
        path = ROOT / "notebooks" / entry.file
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        title = nb.cells[0]
        if not BADGE_LINE.search(title.source):
            raise SystemExit(f"{entry.file}: its first cell has no '[![Open In Colab]...' badge line")
        badges = entry.badges()
        title.source = BADGE_LINE.sub(lambda _, badges=badges: badges, title.source, count=1)
        install = next(c for c in nb.cells if c.cell_type == "code")
        install.source = entry.install_cell()
        if nbformat.writes(nb) != before:
            nbformat.write(nb, path)
            changed.append(entry.file)
    return changed


def main() -> None:
    update_readme()
    changed = update_notebooks()
    print("README.md course map and module table updated; notebooks rewritten:", ", ".join(changed) or "none")


if __name__ == "__main__":
    main()
