"""The device a process computes on: the best one available, checked before use; whether it computes bfloat16
natively (so that bf16 autocast pays); its readable name; and the random state a process draws from."""

import os
import platform
import re
from pathlib import Path

import torch


def default_device() -> torch.device:
    "The best available device: CUDA, then Apple's MPS, then the CPU."
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def check_device(device=None) -> torch.device:
    "`device` (default: `default_device()`) as a `torch.device`; a plain error when this machine cannot use it."
    device = torch.device(device) if device is not None else default_device()
    if not {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}.get(device.type, True):
        raise ValueError(f"device {str(device)!r} is not available here; use the CPU (--device cpu, device=\"cpu\" in "
                         "Python)")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as err:
        raise ValueError(f"device {str(device)!r} is not usable here ({str(err).split('. ')[0]}); use the CPU "
                         "(--device cpu, device=\"cpu\" in Python)") from None
    return device


def rng_state(device: torch.device) -> dict:
    "The random state this process draws from: the CPU's, and that of the GPU it trains on (each process has its own)."
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    "Restore what `rng_state` returned."
    torch.set_rng_state(state["cpu"])
    if isinstance(state["cuda"], torch.Tensor) and device.type == "cuda":  # a GPU run resumed on a GPU
        torch.cuda.set_rng_state(state["cuda"], device)


def bf16_supported(device, cpuinfo="/proc/cpuinfo") -> bool:
    """Whether `device` computes in bfloat16 natively, which bf16 autocast needs to pay: a CUDA GPU that supports it,
    or a CPU with AVX-512 BF16 or AMX-BF16 instructions (Linux lists them in `cpuinfo`; elsewhere: False)."""
    device, cpuinfo = torch.device(device), Path(cpuinfo)
    if device.type == "cuda":  # natively from Ampere (compute capability 8) on; older GPUs only emulate it
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu" or not cpuinfo.exists():
        return False
    flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def bf16_by_default(device) -> bool:
    """Whether training runs its forward pass in bf16 autocast unless told otherwise (`train --bf16/--no-bf16`):
    wherever the device computes bfloat16 natively (`bf16_supported`). On a CPU with AVX-512 BF16, the recipe
    `multi30k-cpu` at 2,200 updates without dropout trained about twice as fast in it, with validation BLEU within the
    spread of three seeds (the speed chapter measures both)."""
    return bf16_supported(device)


def device_name(device: str) -> str:
    "A readable name of the machine a run used: the GPU's name, or the processor's with the number of cores."
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # Linux names the processor model here
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        name = models[0] if models else name
    return f"{name}, {os.cpu_count()} CPU cores"


def device_slug(name: str) -> str:
    "A file-name-safe form of a device name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"
