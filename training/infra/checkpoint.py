"""Checkpoints: safetensors + JSON only (nothing is ever unpickled), written atomically.

Layout of a run directory::

    checkpoints/
      iter-000004/            one complete checkpoint
        model/                the policy as a Hugging Face directory (save_pretrained: safetensors,
                              config.json, tokenizer), or with LoRA (policy.lora_rank > 0) the adapter
                              alone (adapter_model.safetensors, adapter_config.json naming the base
                              model's directory): usable as ``policy.name_or_path`` either way
        optimizer.safetensors optimizer tensors, flattened ("state/<param index>/<name>")
        rng.safetensors       array-valued RNG states (torch, numpy MT19937 keys)
        state.json            iteration, trainer state, config, optimizer metadata, scalar RNG states
        MANIFEST.json         sha256 and size of every file above; written last
      last.json, best.json    pointers {"dir": "iter-000004", "iteration": 4}, replaced atomically
      sft.json                the post-SFT policy (iteration 0): the KL reference

A checkpoint is written into a temporary directory, every file is fsynced, the manifest goes last,
then the directory is renamed into place and only then the pointer is replaced. A kill at any moment
leaves either the previous pointer (to a complete checkpoint) or the new one; a directory without a
valid manifest is never loaded. A save that fails (a full disk, a quota) removes its temporary
directory and raises :class:`CheckpointError` saying what failed and about how much space a save
needs; what a kill leaves behind (``.tmp-*``) is removed when the run starts again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from agent_rl.config import respelled
from agent_rl.training.infra.distributed import broadcast_flag

FORMAT_VERSION = 1
CHECKPOINTS = "checkpoints"
MANIFEST = "MANIFEST.json"
POINTERS = ("last", "best", "sft")
LEFTOVER_PREFIX = ".tmp-"
"""Names of the temporary files and directories of saves in progress; a kill leaves them behind."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or does not match the current run."""


@dataclass
class Checkpoint:
    """A verified checkpoint on disk."""

    path: Path
    """The ``iter-NNNNNN`` directory."""
    state: dict[str, Any]
    """Contents of ``state.json``."""

    @property
    def iteration(self) -> int:
        return int(self.state["iteration"])

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


# ---- files ------------------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f"{LEFTOVER_PREFIX}{path.name}-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        _fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_path(path.parent)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} is missing")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {str(path)!r} is not valid JSON: {exc}") from None


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"checkpoint file {str(path)!r} is not a readable safetensors file: {exc}") from None


# ---- RNG states -------------------------------------------------------------------------------------


def capture_rng(generators: dict[str, Any] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Global python/numpy/torch RNG states plus named generators (``np.random.Generator``,
    ``torch.Generator``, ``random.Random``), split into tensors and JSON-safe values."""
    tensors: dict[str, torch.Tensor] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda/{i}"] = state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy/keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    scalars: dict[str, Any] = {
        "python": _python_state(random.getstate()),
        "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "generators": {},
    }
    for name, gen in (generators or {}).items():
        if isinstance(gen, np.random.Generator):
            scalars["generators"][name] = {"type": "numpy", "state": gen.bit_generator.state}
        elif isinstance(gen, torch.Generator):
            tensors[f"generator/{name}"] = gen.get_state()
            scalars["generators"][name] = {"type": "torch"}
        elif isinstance(gen, random.Random):
            scalars["generators"][name] = {"type": "python", "state": _python_state(gen.getstate())}
        else:
            raise TypeError(f"cannot checkpoint generator {name!r} of type {type(gen).__name__}")
    return tensors, scalars


def _python_state(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def restore_rng(
    tensors: dict[str, torch.Tensor], scalars: dict[str, Any], generators: dict[str, Any] | None = None
) -> None:
    """Inverse of :func:`capture_rng`; named generators are restored in place."""
    try:
        torch.set_rng_state(tensors["torch"])
        if torch.cuda.is_available():
            states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda/"))]
            if states:
                torch.cuda.set_rng_state_all(states)
        numpy_state = scalars["numpy"]
        keys = tensors["numpy/keys"].numpy().astype(np.uint32)
        np.random.set_state(
            (numpy_state["kind"], keys, numpy_state["pos"], numpy_state["has_gauss"], numpy_state["cached"])
        )
        version, internal, gauss = scalars["python"]
        random.setstate((version, tuple(internal), gauss))
        for name, gen in (generators or {}).items():
            saved = scalars["generators"][name]
            if isinstance(gen, np.random.Generator):
                gen.bit_generator.state = saved["state"]
            elif isinstance(gen, torch.Generator):
                gen.set_state(tensors[f"generator/{name}"])
            else:
                version, internal, gauss = saved["state"]
                gen.setstate((version, tuple(internal), gauss))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint RNG state is incomplete or invalid: {exc!r}") from None


# ---- optimizer ---------------------------------------------------------------------------------------


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, param_state in state_dict["state"].items():
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{index}/{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    meta = {"param_groups": state_dict["param_groups"], "scalar_state": scalars}
    return tensors, meta


def _restore_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = meta.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        raise CheckpointError("checkpoint optimizer has a different number of parameter groups")
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise CheckpointError(f"checkpoint optimizer tensor {key!r} has an unknown name")
        index = int(parts[1])
        if index >= len(params):
            raise CheckpointError(
                f"checkpoint optimizer holds state for parameter {index}, the model has {len(params)}"
            )
        if value.dim() > 0 and value.shape != params[index].shape:
            raise CheckpointError(
                f"checkpoint optimizer tensor {key!r} has shape {tuple(value.shape)}, "
                f"parameter {index} has shape {tuple(params[index].shape)}"
            )
        state.setdefault(index, {})[parts[2]] = value.to(params[index].device)
    for index, values in meta.get("scalar_state", {}).items():
        state.setdefault(int(index), {}).update(values)
    for group, saved in zip(optimizer.param_groups, groups):
        if len(saved.get("params", [])) != len(group["params"]):
            raise CheckpointError("checkpoint optimizer parameter groups differ in size from the model's")
        if "betas" in saved:
            saved["betas"] = tuple(saved["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# ---- model weights -------------------------------------------------------------------------------------


def load_model_weights(model: torch.nn.Module, model_dir: Path) -> None:
    """Load ``model_dir``'s safetensors into ``model`` with strict name and shape checks; a model with
    LoRA adapters loads the adapter weights (``adapter_model.safetensors``).

    Parameters tied to a loaded tensor (shared storage, e.g. tied embeddings) may be absent from the
    file, as ``save_pretrained`` drops them."""
    from agent_rl.training.models.policy import ADAPTER_CONFIG, is_lora

    model_dir = Path(model_dir)
    holds_adapter = (model_dir / ADAPTER_CONFIG).is_file()
    if is_lora(model):
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        if not holds_adapter:
            raise CheckpointError(
                f"{str(model_dir)!r} holds no LoRA adapter ({ADAPTER_CONFIG}) but the model has one "
                "(policy.lora_rank > 0): was it written with policy.lora_rank=0?"
            )
        tensors = _read_tensors(model_dir / "adapter_model.safetensors")
        _check_weights(tensors, get_peft_model_state_dict(model))
        set_peft_model_state_dict(model, tensors)
        return
    if holds_adapter:
        raise CheckpointError(
            f"{str(model_dir)!r} holds a LoRA adapter but the model has none: set policy.lora_rank (and the other "
            "policy.lora_* keys) as in the run that wrote it"
        )
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no model weights (*.safetensors) in {str(model_dir)!r}")
    tensors = {}
    for path in files:
        tensors.update(_read_tensors(path))
    _check_weights(tensors, model.state_dict())
    model.load_state_dict(tensors, strict=False)


def _check_weights(tensors: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> None:
    """Every tensor names one of ``own`` with its shape, and every one of ``own`` is loaded (or shares
    storage with a loaded one)."""
    for key, value in tensors.items():
        if key not in own:
            raise CheckpointError(f"checkpoint weight {key!r} does not exist in the model (different architecture?)")
        if own[key].shape != value.shape:
            raise CheckpointError(
                f"checkpoint weight {key!r} has shape {tuple(value.shape)}, the model expects {tuple(own[key].shape)}"
            )
    loaded_storage = {own[key].data_ptr() for key in tensors}
    missing = [key for key in own if key not in tensors and own[key].data_ptr() not in loaded_storage]
    if missing:
        raise CheckpointError(f"checkpoint lacks model weights {missing[:5]} (of {len(missing)} missing)")


# ---- save / load ----------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: str | Path,
    iteration: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None,
    config: dict[str, Any],
    trainer_state: dict[str, Any],
    generators: dict[str, Any] | None = None,
    pointers: tuple[str, ...] = ("last",),
) -> Path:
    """Write checkpoint ``iter-<iteration>`` atomically and point ``pointers`` (last/best) at it.

    A save that cannot be written (too little free space, a failed write) raises
    :class:`CheckpointError`; the earlier checkpoints and every pointer stay as they were."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter-{iteration:06d}"
    needed = checkpoint_bytes(model, optimizer)
    if shutil.disk_usage(root).free < needed:
        raise CheckpointError(_save_failure(final, "too little free space", needed))
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{LEFTOVER_PREFIX}{final.name}-", dir=root))
        _write_checkpoint_files(
            tmp,
            iteration,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            config=config,
            trainer_state=trainer_state,
            generators=generators,
        )
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_save_failure(final, str(exc), needed)) from exc
    if final.exists():  # left by a run killed before its pointer moved: never referenced, safe to replace
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_path(root)
    for name in pointers:
        try:
            set_pointer(run_dir, name, final, iteration)
        except OSError as exc:
            raise CheckpointError(
                f"checkpoint {str(final)!r} was written but its pointer {name!r} could not be updated ({exc}); "
                "every pointer still names a complete checkpoint"
            ) from exc
    prune(run_dir)
    return final


def _write_checkpoint_files(
    directory: Path, iteration: int, *, model, tokenizer, optimizer, config, trainer_state, generators
) -> None:
    """Every file of a checkpoint, fsynced, the manifest last."""
    model.save_pretrained(directory / "model", safe_serialization=True)
    tokenizer.save_pretrained(directory / "model")
    optimizer_meta: dict[str, Any] = {}
    if optimizer is not None:
        opt_tensors, optimizer_meta = _flatten_optimizer(optimizer)
        save_file(opt_tensors, str(directory / "optimizer.safetensors"))
    rng_tensors, rng_scalars = capture_rng(generators)
    save_file({k: v.contiguous() for k, v in rng_tensors.items()}, str(directory / "rng.safetensors"))
    state = {
        "format": FORMAT_VERSION,
        "iteration": int(iteration),
        "config": config,
        "trainer": trainer_state,
        "optimizer": optimizer_meta,
        "has_optimizer": optimizer is not None,
        "rng": rng_scalars,
    }
    (directory / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    manifest = {"format": FORMAT_VERSION, "files": {}}
    for path in files:
        _fsync_path(path)
        manifest["files"][path.relative_to(directory).as_posix()] = {
            "sha256": _sha256(path),
            "bytes": path.stat().st_size,
        }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    _fsync_path(directory / MANIFEST)
    for folder in {p.parent for p in files} | {directory}:
        _fsync_path(folder)


def checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """About the bytes one checkpoint takes on disk: the weights it holds (the adapter alone under
    LoRA, tied tensors once) and the optimizer's tensors; the tokenizer and JSON files come on top."""
    from agent_rl.training.models.policy import is_lora

    weights = [p for p in model.parameters() if p.requires_grad] if is_lora(model) else model.state_dict().values()
    sizes = {t.data_ptr(): t.numel() * t.element_size() for t in weights}
    state = optimizer.state.values() if optimizer is not None else ()
    moments = sum(v.numel() * v.element_size() for s in state for v in s.values() if isinstance(v, torch.Tensor))
    return sum(sizes.values()) + moments


def _save_failure(final: Path, reason: str, needed: int) -> str:
    try:
        free = f"{shutil.disk_usage(final.parent).free / 1e6:,.0f} MB are free there"
    except OSError:
        free = "the free space there is unknown"
    return (
        f"could not save checkpoint {str(final)!r}: {reason}. A checkpoint of this run needs about "
        f"{needed / 1e6:,.0f} MB and {free}; the earlier checkpoints and their pointers are unchanged"
    )


def set_pointer(run_dir: str | Path, name: str, checkpoint_dir: Path, iteration: int) -> None:
    if name not in POINTERS:
        raise ValueError(f"checkpoint pointer must be one of {POINTERS}, got {name!r}")
    _write_json_atomic(
        Path(run_dir) / CHECKPOINTS / f"{name}.json", {"dir": checkpoint_dir.name, "iteration": int(iteration)}
    )


def prune(run_dir: str | Path) -> None:
    """Delete checkpoint directories no pointer references, and leftovers of interrupted saves."""
    root = Path(run_dir) / CHECKPOINTS
    keep = set()
    for name in POINTERS:
        pointer = root / f"{name}.json"
        if pointer.is_file():
            keep.add(_read_json(pointer).get("dir"))
    for path in root.iterdir():
        if path.is_dir() and path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(run_dir: str | Path) -> list[str]:
    """Delete what interrupted saves left in ``run_dir`` (``.tmp-*``: never referenced by a
    pointer); returns their names."""
    root = Path(run_dir) / CHECKPOINTS
    leftovers = sorted(p for p in root.iterdir() if p.name.startswith(LEFTOVER_PREFIX)) if root.is_dir() else []
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return [p.name for p in leftovers]


def holds_checkpoints(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint or a pointer (leftovers of interrupted saves do not count)."""
    root = Path(run_dir) / CHECKPOINTS
    return root.is_dir() and any(not p.name.startswith(LEFTOVER_PREFIX) for p in root.iterdir())


def verify(path: Path) -> None:
    """Check a checkpoint directory against its manifest (presence, size, sha256 of every file)."""
    manifest = _read_json(path / MANIFEST)
    if manifest.get("format") != FORMAT_VERSION or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"checkpoint {str(path)!r} has an unknown manifest format")
    for rel, entry in manifest["files"].items():
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {rel!r} is missing")
        if file.stat().st_size != entry["bytes"] or _sha256(file) != entry["sha256"]:
            raise CheckpointError(f"checkpoint file {str(file)!r} is corrupt (checksum mismatch)")


def find_checkpoint(run_dir: str | Path, name: str = "last") -> Checkpoint:
    """The verified checkpoint ``name`` (last/best) of ``run_dir``."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / f"{name}.json"
    if not pointer.is_file():
        raise CheckpointError(f"no {name!r} checkpoint in {str(run_dir)!r} (missing {str(pointer)!r})")
    target = _read_json(pointer)
    if not isinstance(target, dict) or not isinstance(target.get("dir"), str):
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} is malformed")
    path = root / target["dir"]
    if not path.is_dir():
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} names a missing directory {target['dir']!r}")
    verify(path)
    state = _read_json(path / "state.json")
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r} has format {state.get('format')!r}, expected {FORMAT_VERSION}")
    return Checkpoint(path=path, state=state)


def flatten_config(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as one dict of dotted keys (a flat one comes back unchanged)."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def config_differences(saved: dict[str, Any], current: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config dicts (``ignore``: key prefixes)."""
    a, b = (
        {key: respelled(key, value) for key, value in flatten_config(json.loads(json.dumps(config))).items()}
        for config in (saved, current)
    )
    keys = sorted(set(a) | set(b))
    return [k for k in keys if a.get(k) != b.get(k) and not any(k == p or k.startswith(p + ".") for p in ignore)]


def restore(
    checkpoint: Checkpoint,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    generators: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    ignore_config: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Load weights, optimizer and RNG states into the given objects; return the trainer state.

    With ``config``, a checkpoint trained under a different configuration (outside ``ignore_config``)
    is refused with the list of differing keys."""
    if config is not None:
        diff = config_differences(checkpoint.state.get("config", {}), config, ignore_config)
        if diff:
            shown = ", ".join(diff[:8]) + (" ..." if len(diff) > 8 else "")
            raise CheckpointError(f"checkpoint {str(checkpoint.path)!r} was written with a different config: {shown}")
    load_model_weights(model, checkpoint.model_dir)
    if optimizer is not None:
        if not checkpoint.state.get("has_optimizer"):
            raise CheckpointError(f"checkpoint {str(checkpoint.path)!r} holds no optimizer state")
        _restore_optimizer(
            optimizer, _read_tensors(checkpoint.path / "optimizer.safetensors"), checkpoint.state["optimizer"]
        )
    restore_rng(_read_tensors(checkpoint.path / "rng.safetensors"), checkpoint.state.get("rng", {}), generators)
    return checkpoint.state.get("trainer", {})


# ---- run directories ------------------------------------------------------------------------------------


def claim_run_dir(run_dir: str | Path, dist) -> None:
    """Refuse a run directory that already holds checkpoints (a fresh run would overwrite them),
    else create it. Rank 0 decides for every learner process (``dist``): it may write its first
    checkpoint before another rank looks."""
    if broadcast_flag(dist.is_main and holds_checkpoints(run_dir), dist):
        raise FileExistsError(
            f"run directory {str(run_dir)!r} already holds checkpoints; resume it with "
            f"--resume {run_dir} (or --resume auto) or choose another trainer.run_dir"
        )
    if dist.is_main:
        Path(run_dir).mkdir(parents=True, exist_ok=True)


def intact_checkpoints(run_dir: str | Path) -> dict[str, int]:
    """The pointers of ``run_dir`` whose checkpoints verify, with their iterations."""
    intact = {}
    for name in POINTERS:
        try:
            intact[name] = find_checkpoint(run_dir, name).iteration
        except CheckpointError:
            continue
    return intact


def resume_command(run_dir: str | Path, which: str = "last") -> str:
    """The command that continues the run in ``run_dir`` from its checkpoint ``which``."""
    return f"agent-rl train --resume {run_dir}" + (f" --resume-from {which}" if which != "last" else "")


def _alternatives(run_dir: str | Path, refused: str) -> str:
    others = {name: it for name, it in intact_checkpoints(run_dir).items() if name != refused}
    if not others:
        return "it holds no other intact checkpoint: start a new run in another trainer.run_dir"
    listed = "; ".join(f"{name!r} (iteration {it}): {resume_command(run_dir, name)}" for name, it in others.items())
    return f"its intact checkpoints resume with: {listed}"


def rewind(run_dir: str | Path, which: str) -> list[str]:
    """Make the checkpoint ``which`` the run's latest: ``last``, and any pointer naming a later or
    unreadable checkpoint, now name it, and what no pointer names is deleted (a resume from an
    earlier checkpoint runs the iterations after it again). Returns the pointers moved."""
    root = Path(run_dir) / CHECKPOINTS
    target = _read_json(root / f"{which}.json")
    moved = []
    for name in POINTERS:
        pointer = root / f"{name}.json"
        if name == which or (name != "last" and not pointer.is_file()):
            continue
        iteration = _pointer_iteration(pointer)
        if name == "last" or iteration is None or iteration > target["iteration"]:
            set_pointer(run_dir, name, root / target["dir"], target["iteration"])
            moved.append(name)
    prune(run_dir)
    return moved


def _pointer_iteration(pointer: Path) -> int | None:
    """The iteration a pointer file names (not verified), or None when it is missing or unreadable."""
    try:
        return int(json.loads(pointer.read_text())["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def saved_iteration(run_dir: str | Path) -> int | None:
    """The iteration the ``last`` pointer names (not verified), or None before the first save."""
    return _pointer_iteration(Path(run_dir) / CHECKPOINTS / "last.json")


def how_to_go_on(run_dir: str | Path | None, nothing_saved: str = "no checkpoint was saved yet") -> str:
    """What a stopped run in ``run_dir`` saved, and the command that continues it; ``nothing_saved``
    before its first checkpoint."""
    saved = saved_iteration(run_dir) if run_dir else None
    if saved is None:
        return nothing_saved
    return f"the last checkpoint is iteration {saved}; continue with: {resume_command(run_dir)}"


def resume_run(
    run_dir: str | Path,
    config,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generators: dict[str, Any],
    may_change: tuple[str, ...],
    which: str = "last",
) -> tuple[int, dict[str, Any]]:
    """Restore the checkpoint ``which`` (last, best, sft) of ``run_dir`` into the given objects;
    returns its iteration and the trainer state. The checkpoint's config must equal ``config``
    (resolved) outside the ``may_change`` keys; it is resolved before the comparison, so
    checkpoints written before configs were resolved (with ``auto`` and nulls) still resume.

    A missing or corrupt checkpoint is refused, never replaced by another: the error names the
    run's intact checkpoints and the command that resumes from each."""
    from agent_rl.config import config_from_dict, config_to_dict
    from agent_rl.training.infra.resolution import resolve

    try:
        found = find_checkpoint(run_dir, which)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; nothing was loaded, and {_alternatives(run_dir, which)}") from None
    saved = config_to_dict(resolve(config_from_dict(found.state.get("config", {}))))
    found = Checkpoint(found.path, {**found.state, "config": saved})
    state = restore(
        found,
        model=model,
        optimizer=optimizer,
        generators=generators,
        config=config_to_dict(resolve(config)),
        ignore_config=may_change,
    )
    return found.iteration, state
