"""Reference solutions of notebook 00's exercises and typical wrong attempts (for tests/test_solutions.py)."""

import os

import torch


def pick_device():
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def pick_device_without_fallback():
    """Written on a GPU machine and never run without one: there is no CPU branch."""
    return torch.device("cuda:0")


def machine_report(nprocs):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpus": os.cpu_count(), "gpus": gpus, "backend": "nccl" if gpus >= nprocs else "gloo"}


def machine_report_any_gpu_means_nccl(nprocs):
    """Picks NCCL as soon as there is one GPU: on Colab (1 GPU) two processes would share it."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpus": os.cpu_count(), "gpus": gpus, "backend": "nccl" if gpus > 0 else "gloo"}


SOLUTIONS = {"00.1": (pick_device,), "00.2": (machine_report,)}
WRONG = {"00.1": (pick_device_without_fallback,), "00.2": (machine_report_any_gpu_means_nccl,)}
