"""Sphinx configuration of the course website (built by ``python tools/build_site.py``).

The pages' sources are generated into ``build/site/src`` by that script (the notebooks with a header
added, the course map, the syllabus, the module table, the GPU runs); this file only says how Sphinx
renders them: MyST-NB reads the notebooks and shows their *stored* outputs (never executes them),
sphinx-book-theme draws the book (table of contents on the left, the page's sections on the right),
and Sphinx's own search index gives full-text search without a server.
"""

from __future__ import annotations

project = "Multi-GPU training in PyTorch"
author = "the mgpu-course authors"
copyright = "the mgpu-course authors (MIT)"

extensions = ["myst_nb"]

# The committed outputs are the lesson (a real top-to-bottom run); the site never re-runs a notebook.
nb_execution_mode = "off"
# A live widget needs a kernel; every widget cell also stores a static picture (PNG or HTML), which the
# site shows instead of an empty widget area (no widget state is saved, so nothing could render).
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
# Long stream outputs (tables, logs) stay whole; the reader scrolls.
nb_merge_streams = True
# Markdown a cell prints (00's course map) is MyST: tables render, links to notebooks resolve to pages.
nb_render_markdown_format = "myst"

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist", "html_image"]
# Links such as ``notebooks/04a_ddp_fundamentals.ipynb#the-ring`` resolve to a section's anchor.
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = "Multi-GPU training in PyTorch"
html_static_path = ["_static"]
html_css_files = ["course.css"]
# The reader's light/dark choice starts from the system's (an empty stored choice logs a console error).
html_context = {"default_mode": "auto"}
html_copy_source = False
html_show_sourcelink = False
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    # The landing page's only section is the course map: no "Contents" column beside it.
    "secondary_sidebar_items": {"**": ["page-toc"], "index": []},
}
html_favicon = "_static/favicon.svg"
# Quiet, reproducible builds: no "last updated" stamps, no external fetches at build time.
html_last_updated_fmt = None
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
