"""GGUF files as policies: the first use of a file dequantizes it to float32 with transformers' GGUF
loader and writes a Hugging Face directory (safetensors, config, tokenizer with its chat template)
to the cache, one per source file, recording the file's sha256; a file whose contents changed is
converted again."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch


class GGUFError(ValueError):
    """A GGUF file that cannot become a policy: not GGUF, truncated, corrupt, or of an architecture
    transformers cannot load."""


GGUF_RECORD = "agent_rl_gguf.json"
"""Written into a converted directory: the source file and the sha256 of the contents converted."""


def gguf_policy_dir(gguf_path: str | os.PathLike, root: str | os.PathLike) -> Path:
    """The Hugging Face directory converted from ``gguf_path`` under the cache ``root``, converting it
    first when the cache holds no conversion of the file's current contents (safe across processes;
    atomic: a failed conversion leaves nothing behind)."""
    from filelock import FileLock
    from rich.console import Console

    source = Path(gguf_path).resolve()
    digest = file_sha256(source)
    root = Path(root)
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in source.stem)
    target = root / f"gguf-{stem}-{hashlib.sha256(str(source).encode()).hexdigest()[:12]}"
    if converted_digest(target) == digest:
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if converted_digest(target) == digest:  # another process converted it while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        stale = root / f".{target.name}-stale-{os.getpid()}"
        console, start = Console(stderr=True), time.perf_counter()
        try:
            with console.status(f"converting {source} to a float32 Hugging Face directory (once)"):
                convert_gguf(source, staging)
            console.print(f"converted {source.name} in {time.perf_counter() - start:.0f} s: {target}")
            (staging / GGUF_RECORD).write_text(json.dumps({"source": str(source), "sha256": digest}, indent=2))
            if target.exists():  # converted from the file's earlier contents
                os.replace(target, stale)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(stale, ignore_errors=True)
    return target


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(2**22):
            digest.update(chunk)
    return digest.hexdigest()


def converted_digest(directory: Path) -> str | None:
    """The sha256 of the GGUF contents ``directory`` was converted from; None when it holds no conversion."""
    try:
        return json.loads((directory / GGUF_RECORD).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def gguf_architectures() -> set[str]:
    """The model types transformers' two GGUF loaders accept (the legacy table lists two
    metadata sections, ``general`` and ``tokenizer``, among them)."""
    from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return {*GGUF_SUPPORTED_ARCHITECTURES, *GGUF_ARCHS} - {"general", "tokenizer"}


def gguf_architecture_supported(architecture: str) -> bool:
    """Whether transformers loads a GGUF file of this ``general.architecture``; the legacy loader
    renames a few llama.cpp names first (``qwen2moe`` -> ``qwen2_moe``, ``gpt-oss`` -> ``gpt_oss``,
    ``t5encoder`` -> ``t5``)."""
    renamed = (
        "t5" if architecture.startswith("t5") else re.sub(r"^(qwen\d)moe$", r"\1_moe", architecture.replace("-", "_"))
    )
    return bool({architecture, renamed} & gguf_architectures())


def convert_gguf(source: Path, directory: Path) -> None:
    """Dequantize the GGUF file ``source`` to float32 and write it to ``directory`` as a Hugging Face
    model: safetensors, config, generation config, tokenizer and chat template."""
    from agent_rl.training.models.known import GGUF_REQUIREMENTS, missing_requirements

    if missing := missing_requirements():
        raise ImportError(
            f"reading {source} needs {' and '.join(missing)}: pip install "
            f"{' '.join(repr(r) for r in GGUF_REQUIREMENTS)} "
            "(agent-rl models install NAME installs them too)"
        )
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        reader = gguf.GGUFReader(source)
        architecture = str(reader.fields["general.architecture"].contents())
    except Exception as exc:  # GGUFReader raises ValueError, IndexError, KeyError... on broken files
        raise GGUFError(
            f"{source}: not a readable GGUF file, truncated or corrupt ({type(exc).__name__}: {exc})"
        ) from exc
    del reader  # releases its memory map
    if not gguf_architecture_supported(architecture):
        raise GGUFError(
            f"{source}: GGUF architecture {architecture!r} is not supported by transformers' GGUF loader "
            f"(supported: {', '.join(sorted(gguf_architectures()))})"
        )
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(source.parent),
            gguf_file=str(source),
            dtype=torch.float32,
            local_files_only=True,
            quantization_config=GgufConfig(dequantize=True),
            output_loading_info=True,
        )
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=str(source), local_files_only=True)
    except Exception as exc:  # whatever the loader trips on, the user needs the file's name
        raise GGUFError(f"{source}: transformers could not load it ({type(exc).__name__}: {exc})") from exc
    if info["missing_keys"]:
        raise GGUFError(
            f"{source}: the file lacks tensors the {architecture} model needs: {sorted(info['missing_keys'])}"
        )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
