"""Rewrite README.md's course-map table from ``mgpu_helpers.course`` (tests fail when they differ).

    python tools/update_readme.py
"""

from __future__ import annotations

import pathlib
import re

from mgpu_helpers.course import course_map_markdown

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text()
    table = re.compile(r"^\| # \| Notebook \|.*?(?=\n\n)", flags=re.S | re.M)
    if not table.search(text):
        raise SystemExit("README.md has no course-map table (a line starting '| # | Notebook |')")
    README.write_text(table.sub(lambda _: course_map_markdown(), text, count=1))
    print("README.md course map updated")


if __name__ == "__main__":
    main()
