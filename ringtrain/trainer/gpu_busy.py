"""GPU busy fraction of this process, sampled through NVML (optional nvidia-ml-py).

NVML keeps a short history of per-process SM utilisation samples; the sampler reads the
samples of this process since the last call and averages them. Where per-process samples
are unavailable it falls back to the whole device's utilisation (then a GPU shared by two
ranks reports the same value for both). Without NVML or CUDA it reports nothing.
"""

from __future__ import annotations

import os

import torch

try:
    import pynvml
except ImportError:  # optional dependency: the `gpu` extra
    pynvml = None


class GpuBusySampler:
    """Call `sample()` now and then; it returns the busy fraction since the last call."""

    def __init__(self, device: torch.device) -> None:
        self._handle = None
        self._last_seen = 0
        self._pid = os.getpid()
        if pynvml is None or device.type != "cuda":
            return
        try:
            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except Exception:
            self._handle = None

    def sample(self) -> float | None:
        """Mean busy fraction (0..1) of this process since the previous sample, or None."""
        if self._handle is None:
            return None
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(self._handle, self._last_seen)
        except pynvml.NVMLError:
            samples = []
        mine = [s for s in samples if s.pid == self._pid]
        if samples:
            self._last_seen = max(s.timeStamp for s in samples)
        if mine:
            return sum(s.smUtil for s in mine) / (100.0 * len(mine))
        try:
            return pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0
        except pynvml.NVMLError:
            return None
