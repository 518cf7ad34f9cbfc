"""What a measurement needs from the device ChatTTS runs on: wait for its queued work, its peak and total memory.

Each function takes the device as a string and does nothing (or says None) on the CPU, so the same
measuring code runs, and is tested, without CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MemoryBudget:
    """A GPU's memory in MiB: what is free now and what it has in all."""

    free_mb: float
    total_mb: float


def on_cuda(device: str) -> bool:
    """Say whether ``device`` names a CUDA device that torch can use here."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def synchronize(device: str) -> None:
    """Wait until ``device`` has finished the work queued on it, so a clock read after it means something."""
    if on_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def reset_peak_memory(device: str) -> None:
    """Start counting ``device``'s peak memory afresh."""
    if on_cuda(device):
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def peak_memory_mb(device: str) -> float | None:
    """Return the most memory torch's tensors held on ``device`` since the last reset, in MiB (None on the CPU)."""
    if not on_cuda(device):
        return None
    return torch.cuda.max_memory_allocated(torch.device(device)) / 2**20


def memory_budget(device: str) -> MemoryBudget | None:
    """Return ``device``'s free and total memory (None on the CPU, which has no budget of its own here)."""
    if not on_cuda(device):
        return None
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return MemoryBudget(free_mb=free / 2**20, total_mb=total / 2**20)


def device_name(device: str) -> str:
    """Return what ``device`` is, in words: the GPU's name, or the CPU and its torch threads."""
    if on_cuda(device):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU, {torch.get_num_threads()} torch threads"
