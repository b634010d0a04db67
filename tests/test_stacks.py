"""The pinned students' stacks (mgpu_helpers/stacks/) and what the doctor says about them."""

import sys

import pytest

from mgpu_helpers import stacks
from mgpu_helpers.doctor import Facts, findings

COLAB = stacks.load("colab")


def test_each_stack_names_its_python_torch_and_dated_source():
    for name in stacks.STACKS:
        stack = stacks.load(name)
        assert stack.python >= (3, 10) and stack.pins["torch"].count(".") == 2, name
        assert stack.sources, f"{name}.txt names no source"
    assert COLAB.python == (3, 13) and COLAB.date == "2026-08-19"
    assert COLAB.pins["ipython"] == "7.34.0" and COLAB.pins["psutil"] == "5.9.5"
    kaggle = stacks.load("kaggle")
    assert kaggle.python == (3, 12) and kaggle.pins["torch"] == "2.10.0"
    assert kaggle.pins["ipywidgets"] == "8.1.5"
    with pytest.raises(ValueError, match="choose one of colab, kaggle, newest"):
        stacks.load("binder")


def test_the_constraint_files_keep_out_what_pypi_cannot_install():
    for name in stacks.STACKS:
        text = (stacks.Path(stacks.__file__).parent / f"{name}.txt").read_text()
        body = [line for line in text.splitlines() if not line.startswith("#")]
        assert all("==" in line and " @ " not in line and "+" not in line for line in body), name
        assert not [line for line in body if line.startswith(("nvidia-cu", "nvidia-nccl", "cuda-"))], name


def colab_versions(**changes):
    versions = {p: COLAB.pins.get(p.replace("_", "-")) for p in stacks.KEY_PACKAGES}
    versions["torch"] = "2.11.0+cu128"  # Colab's own build: the same release as PyPI's 2.11.0
    return {**versions, **changes}


def test_the_doctor_says_a_colab_runtime_matches_colabs_stack_and_what_the_course_adapts():
    facts = Facts(platform="Colab", python=(3, 13), torch="2.11.0+cu128", versions=colab_versions())
    row = next(r for r in findings(facts) if r.topic == "stack")
    assert row.status == "ok" and "matches Colab's published stack of 2026-08-19" in row.fact
    assert "IPython 7.34.0: the course avoids `x = !cmd`" in row.action
    assert "psutil 5.9.5" in row.action and "ipywidgets 7.7.1" in row.action


def test_the_doctor_names_what_differs_from_the_published_stack():
    facts = Facts(platform="Colab", python=(3, 12), torch="2.12.0", versions=colab_versions(torch="2.12.0"))
    row = next(r for r in findings(facts) if r.topic == "stack")
    assert row.status == "note"
    assert "python 3.12 here (3.13 published)" in row.fact
    assert "torch 2.12.0 here (2.11.0 published)" in row.fact


def test_no_stack_row_off_colab_and_kaggle():
    facts = Facts(platform="Jupyter", python=(3, 11), torch="2.13.0", versions=colab_versions())
    assert not [r for r in findings(facts) if r.topic == "stack"]


def test_the_command_line_check_fails_where_this_environment_is_not_the_stack(capsys):
    here = stacks.installed_versions()
    same = stacks.compare(COLAB, here, sys.version_info[:2])
    assert stacks.main(["colab"]) == (1 if same else 0)
    out = capsys.readouterr().out
    assert "stack colab (2026-08-19)" in out and "ipython" in out
    assert stacks.main(["nonsense"]) == 2
