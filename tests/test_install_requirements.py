"""What ``pip install mgpu-course`` asks of a student's runtime: no optional engine in the base install
(Ray, Optuna, ipyparallel and scikit-learn come with the extras that notebooks 01b, 06a, 06b and 08
install in their first cell), and a torch range that admits both platforms' own builds, so pip never
replaces the preinstalled torch (a CUDA build of several GB) with another.

The wheel itself, installed beside a platform's exact packages (Colab: ipywidgets 7.7.1, torch 2.11)
and running every notebook, is ``nox -s colab`` (noxfile.py): .ci/run runs it after the README's command.
"""

import importlib.metadata

from packaging.requirements import Requirement

from mgpu_helpers import stacks

OPTIONAL_ENGINES = {"ray", "optuna", "ipyparallel", "scikit-learn"}


def _base_requirements() -> list[Requirement]:
    requires = importlib.metadata.requires("mgpu-course") or []
    found = [Requirement(text) for text in requires]
    return [r for r in found if r.marker is None or r.marker.evaluate({"extra": ""})]


def test_the_base_install_brings_no_optional_engine():
    names = {r.name.lower() for r in _base_requirements()}
    assert "torch" in names and not names & OPTIONAL_ENGINES, sorted(names)


def test_the_torch_requirement_admits_colabs_and_kaggles_own_torch():
    torch = next(r for r in _base_requirements() if r.name.lower() == "torch")
    for name in ("colab", "kaggle"):
        published = stacks.load(name).pins["torch"]
        assert torch.specifier.contains(published), f"{name}'s torch {published} is outside {torch}"
