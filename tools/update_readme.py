"""Rewrite README.md's course-map and module tables from ``mgpu_helpers.course`` (tests fail when
they differ).

    python tools/update_readme.py
"""

from __future__ import annotations

import pathlib
import re

from mgpu_helpers.course import course_map_markdown, module_table_markdown

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text()
    for head, table in (("| # | Notebook |", course_map_markdown()), ("| module |", module_table_markdown())):
        pattern = re.compile("^" + re.escape(head) + r".*?(?=\n\n)", flags=re.S | re.M)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no table starting with a line '{head}'")
        text = pattern.sub(lambda _, table=table: table, text, count=1)
    README.write_text(text)
    print("README.md course map and module table updated")


if __name__ == "__main__":
    main()
