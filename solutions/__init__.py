"""Reference solutions, typical wrong attempts (``WRONG``), known shortcuts (``SHORTCUTS``) and other
correct answers (``VARIANTS``) of every graded exercise, one module per notebook (``nbXX.py``), run by
tests/test_solutions.py, tests/test_shortcuts.py and tests/test_grader_variants.py.

Each entry is a whole answer written as a student would write it in the notebook, so a wrong attempt or a
shortcut repeats the reference solution with one change on purpose: the grader must see exactly what a
student would hand in, not a shared helper. Not part of the installed package.
"""
