"""The policy: ``(model, tokenizer)`` from the embedded tiny model, a known model, a GGUF file or a
local Hugging Face model directory, and the LoRA adapters a run may train on it.

``load_policy("embedded")`` builds the embedded model once and caches it (``agent_rl.training.models.embedded``).
``load_policy(path)`` loads any local model directory with its own chat template; a LoRA checkpoint
directory (``adapter_config.json``, written by a run with ``policy.lora_rank`` > 0) loads as its base
model with the adapter merged in. ``load_policy("smollm2-135m-instruct")`` (a name from
``agent_rl.training.models.known.KNOWN_MODELS``, installed with ``agent-rl models install NAME``) and
``load_policy("/path/to/model.gguf")`` read a GGUF file, converted once into a cached Hugging Face
directory (``agent_rl.training.models.gguf``). Nothing is ever downloaded from a hub.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from agent_rl.config import PolicyConfig
from agent_rl.training.models.embedded import EMBEDDED, embedded_policy_dir
from agent_rl.training.models.gguf import gguf_policy_dir
from agent_rl.training.models.known import KNOWN_MODELS, model_file

# For local base models that ship no chat template: plain role headers, the model's own EOS.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '### ' + message['role'] + ':\n' + message['content'] + '\n\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '### assistant:\n' }}{% endif %}"
)


def cache_root() -> Path:
    """Where agent-rl caches built artifacts: ``$AGENT_RL_CACHE`` or the user cache dir."""
    override = os.environ.get("AGENT_RL_CACHE")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("agent-rl"))


def load_policy(
    name_or_path: str | os.PathLike = EMBEDDED,
    *,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    env_ids: list[str] | None = None,
):
    """``(model, tokenizer)`` for ``"embedded"``, a known model's name, a GGUF file or a local Hugging
    Face model directory (see :func:`policy_dir`).

    The tokenizer pads on the left (for batched generation) and always has a pad token and a chat
    template. ``cache_dir`` overrides where the embedded model and GGUF conversions are cached;
    ``env_ids`` chooses the environments the embedded tokenizer is trained on (default: the bundled ones).
    """
    from transformers import AutoModelForCausalLM

    path = policy_dir(name_or_path, cache_dir=cache_dir, env_ids=env_ids)
    tokenizer = load_tokenizer(path)
    if (path / ADAPTER_CONFIG).is_file():
        return merged_adapter_policy(path, dtype=dtype).to(device).eval(), tokenizer
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).to(device)
    model.eval()
    return model, tokenizer


# ---- LoRA adapters (peft) ---------------------------------------------------------------------------

ADAPTER_CONFIG = "adapter_config.json"
"""peft's adapter description; a model directory holding it is a LoRA checkpoint of a base model."""


def _import_peft():
    try:
        import peft
    except ImportError:
        raise ImportError(
            "LoRA adapters need peft: pip install 'agent-rl[lora]' (or pip install 'peft>=0.21,<0.22')"
        ) from None
    return peft


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries peft adapters (only possible once peft is imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def with_lora(model: torch.nn.Module, policy: PolicyConfig) -> torch.nn.Module:
    """``model`` with fresh LoRA adapters as ``policy`` (a :class:`PolicyConfig`) asks for them
    (``lora_rank`` > 0) unless it carries adapters already; otherwise ``model`` itself."""
    if policy.lora_rank <= 0 or is_lora(model):
        return model
    return add_lora(model, rank=policy.lora_rank, alpha=policy.lora_alpha, target_modules=policy.lora_target_modules)


def add_lora(model: torch.nn.Module, *, rank: int, alpha: float, target_modules: list[str]) -> torch.nn.Module:
    """``model`` wrapped with fresh LoRA adapters (``B`` starts at zero, so the policy is unchanged);
    only the adapters require gradients. The adapter config records the base model's directory, so a
    saved adapter loads on its own (``load_policy``)."""
    peft = _import_peft()
    targets = "all-linear" if list(target_modules) == ["all-linear"] else list(target_modules)
    lora = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"
    )
    try:
        wrapped = peft.get_peft_model(model, lora)
    except ValueError as exc:  # peft's "Target modules ... not found in the base model"
        raise ValueError(f"policy.lora_target_modules {list(target_modules)}: {exc}") from None
    base_dir = str(getattr(model, "name_or_path", "") or "")  # "" for a model built in memory
    if base_dir and Path(base_dir).is_dir():
        wrapped.peft_config["default"].base_model_name_or_path = str(Path(base_dir).resolve())
    return wrapped


def merged_adapter_policy(directory: Path, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The base model named in ``directory``'s adapter config with the adapter merged into its weights."""
    from transformers import AutoModelForCausalLM

    peft = _import_peft()
    base = json.loads((directory / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(
            f"{directory} holds a LoRA adapter whose base model {base!r} is not a local model directory; "
            f"set base_model_name_or_path in {ADAPTER_CONFIG} to the base model's directory"
        )
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype=dtype)
    return peft.PeftModel.from_pretrained(model, directory).merge_and_unload()


def serving_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a generation engine serves, on the CPU and named as in the plain model: LoRA
    adapters are merged into their base weights (the training model itself stays unmerged)."""
    # clone(): tied entries share storage, which safetensors refuses to write.
    if not is_lora(model):
        return {name: tensor.detach().to("cpu").clone() for name, tensor in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state = {
        name.replace(".base_layer.", "."): tensor.detach().to("cpu").clone()
        for name, tensor in base.state_dict().items()
        if ".lora_" not in name
    }
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and not module.merged:
                weight = module.get_base_layer().weight
                delta = sum(module.get_delta_weight(adapter) for adapter in module.active_adapters)
                state[f"{name}.weight"] = (weight + delta).to("cpu")
    return state


def policy_dir(
    name_or_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None, env_ids: list[str] | None = None
) -> Path:
    """The Hugging Face directory behind ``name_or_path``, building or converting it when needed:
    ``"embedded"``, a known model's name (its installed GGUF file), a GGUF file, or a model directory."""
    name = str(name_or_path)
    cache = Path(cache_dir) if cache_dir is not None else cache_root() / "policies"
    if name == EMBEDDED:
        return embedded_policy_dir(cache, env_ids)
    if name in KNOWN_MODELS:
        return gguf_policy_dir(model_file(name), cache)
    path = Path(name_or_path)
    if path.is_file():
        return gguf_policy_dir(path, cache)
    if not path.is_dir():
        raise FileNotFoundError(
            f"policy {name!r} is neither 'embedded', a known model ({', '.join(KNOWN_MODELS)}), a GGUF file "
            "nor an existing local model directory (hub downloads are disabled: download the model yourself "
            "and pass its directory or GGUF file)"
        )
    return path


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer of a local model directory, set up for left-padded batched generation."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer
