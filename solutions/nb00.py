"""Reference solutions of notebook 00's exercises and typical wrong attempts (for tests/test_solutions.py)."""

import os

import torch

from mgpu_helpers.hardware import choose_backend, recommended_device


def pick_device():
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def pick_device_without_fallback():
    """Written on a GPU machine and never run without one: there is no CPU branch."""
    return torch.device("cuda:0")


def _usable_cpus():
    """The cores this process may run on: its affinity on Linux, the machine's count elsewhere."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine_report(nprocs):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpus": _usable_cpus(), "gpus": gpus, "backend": "nccl" if gpus >= nprocs else "gloo"}


def machine_report_any_gpu_means_nccl(nprocs):
    """Picks NCCL as soon as there is one GPU: on Colab (1 GPU) two processes would share it."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpus": _usable_cpus(), "gpus": gpus, "backend": "nccl" if gpus > 0 else "gloo"}


SOLUTIONS = {"00.1": (pick_device,), "00.2": (machine_report,)}
WRONG = {"00.1": (pick_device_without_fallback,), "00.2": (machine_report_any_gpu_means_nccl,)}


def pick_device_from_the_course_helper():
    """The course's own helper instead of the rule: the answer without writing it."""
    return recommended_device()


def pick_device_with_the_builds_accelerator():
    """Right on a CPU build of torch only: without check_available=True, a CUDA build (Colab's, also on
    its CPU runtime; Kaggle's) names cuda with no GPU there."""
    return torch.accelerator.current_accelerator() or torch.device("cpu")


def machine_report_from_the_course_helper(nprocs):
    """torch.cuda for the GPU count, but the backend from mgpu_helpers' choose_backend."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpus": _usable_cpus(), "gpus": gpus, "backend": choose_backend(nprocs)}


def machine_report_counting_the_machine(nprocs):
    """os.cpu_count(): the machine's cores, also where a container or taskset leaves this process fewer."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpus": os.cpu_count(), "gpus": gpus, "backend": "nccl" if gpus >= nprocs else "gloo"}


#: Work that gets the right answers without doing the exercise, or only on some builds of torch; each
#: grader must reject it.
SHORTCUTS = {
    "00.1": {
        "recommended_device": (pick_device_from_the_course_helper,),
        "accelerator_of_the_build": (pick_device_with_the_builds_accelerator,),
    },
    "00.2": {
        "choose_backend": (machine_report_from_the_course_helper,),
        "os_cpu_count": (machine_report_counting_the_machine,),
    },
}


def pick_device_by_name():
    """A device made from a string, with no index: torch.device("cuda") is the current GPU, cuda:0 here."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def machine_report_by_pid(nprocs):
    """The affinity asked by process id, and the GPU count alone (0 where CUDA is unavailable)."""
    pid = os.getpid()
    cpus = len(os.sched_getaffinity(pid)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = torch.cuda.device_count()
    return {"cpus": cpus, "gpus": gpus, "backend": "gloo" if gpus < nprocs else "nccl"}


#: Other correct work; each grader must accept it.
def pick_device_with_torch_accelerator():
    """Correct too: the device-generic API, None where no accelerator is available."""
    return torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")


VARIANTS = {
    "00.1": {
        "device_by_name": (pick_device_by_name,),
        "torch_accelerator": (pick_device_with_torch_accelerator,),
    },
    "00.2": {"affinity_by_pid": (machine_report_by_pid,)},
}
