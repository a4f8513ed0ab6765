"""What the `gpu`-marked check tests need to know about the machine."""

from __future__ import annotations

import shutil


def cuda_count() -> int:
    """CUDA devices usable here: 0 without an NVIDIA driver (no nvidia-smi) or without CUDA."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def claim_cuda_torch(host, site_dir, version_file) -> None:
    """Let ``host``'s workers find a torch built for CUDA: ``version_file`` (a recorded
    torch/version.py) becomes the torch package first on their PYTHONPATH. For tests whose
    worker pool is faked, so the requirement gate, not a worker, is what reads it."""
    import os

    pkg = os.path.join(str(site_dir), "torch")
    os.makedirs(pkg, exist_ok=True)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    with open(version_file) as src, open(os.path.join(pkg, "version.py"), "w") as dst:
        dst.write(src.read())
    host.worker.env["PYTHONPATH"] = str(site_dir)
    host.worker.device_type = "cuda"
