"""What the `gpu`-marked check tests need to know about the machine."""

from __future__ import annotations

import shutil


def cuda_count() -> int:
    """CUDA devices usable here: 0 without an NVIDIA driver (no nvidia-smi) or without CUDA."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
