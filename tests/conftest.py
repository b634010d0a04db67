"""Fixtures shared by the hardware tests (test_hardware, test_hardware_sources)."""

import pytest
from _hardware_fakes import Calls


@pytest.fixture
def no_visible_devices_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set CUDA_VISIBLE_DEVICES themselves when they need it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def calls() -> Calls:
    """A fresh record of the calls the NVML / GPUtil fakes saw."""
    return Calls()
