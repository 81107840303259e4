"""The embedded policy: a Qwen2-architecture causal LM of a few million float32 parameters, built
from ``training/configs/tiny_policy.json`` on first use and cached.

Its byte-level BPE tokenizer is trained with ``tokenizers`` on text sampled from the registered
environments (observations, tasks, admissible and oracle actions, error messages) plus the prompt
templates, so game text costs few tokens. It has special tokens, a chat template in which every
message ends with ``<|end|>`` (the EOS: the model emits its action, then ``<|end|>``), and is written
with ``save_pretrained`` so vLLM can load the directory. Random init is seeded: the same config and
environments give the same model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
import tokenize
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

POLICY_CONFIG = Path(__file__).parents[1] / "configs" / "tiny_policy.json"
EMBEDDED = "embedded"
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|end|>"
# Byte-level BPE never needs an unknown token, but transformers loads a qwen2 directory with
# Qwen2Tokenizer, which adds "<|endoftext|>" as its unk token unless the vocabulary has it.
UNK = "<|endoftext|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, *ROLE_TOKENS]
# Every message is "<|role|>\n{content}<|end|>\n"; generation starts after "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
GARBAGE_ACTION = "xyzzy plugh"


def embedded_policy_dir(root: Path, env_ids: list[str] | None = None) -> Path:
    """Directory of the embedded policy under the cache ``root``, building it on first use (safe
    across processes).

    Its tokenizer covers ``env_ids`` (default: the games listed in ``tiny_policy.json``, so the
    default model depends neither on registered plugins nor on optional third-party suites)."""
    from filelock import FileLock

    config = json.loads(POLICY_CONFIG.read_text())
    env_ids, env_digests = covered_envs(env_ids if env_ids is not None else config["tokenizer"]["envs"])
    # The build code and the prompt templates are part of the key: editing them rebuilds.
    code = {
        name: _source_digest(name) for name in ("agent_rl.training.models.embedded", "agent_rl.training.models.prompts")
    }
    key_material = json.dumps({"config": config, "envs": env_digests, "code": code}, sort_keys=True)
    key = hashlib.sha256(key_material.encode()).hexdigest()[:16]
    target = root / f"embedded-{key}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # another process built it while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            build_embedded_policy(staging, config, env_ids)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def tokenizer_env_ids(extra: list[str]) -> list[str] | None:
    """The environments an embedded tokenizer covers: the bundled games of ``tiny_policy.json`` and
    ``extra`` (``policy.tokenizer_envs``); None (the default model) when ``extra`` adds none."""
    bundled = json.loads(POLICY_CONFIG.read_text())["tokenizer"]["envs"]
    added = [env_id for env_id in dict.fromkeys(extra) if env_id not in bundled]
    return bundled + added if added else None


def covered_envs(env_ids: list[str]) -> tuple[list[str], dict[str, str]]:
    """Those of ``env_ids`` whose entry point's module is installed, with a digest of its source (the
    module is found, not imported)."""
    import gymnasium as gym

    from agent_rl.envs import text_env_spec

    ids, digests = [], {}
    for env_id in env_ids:
        text_env_spec(env_id)  # unknown ids raise a KeyError naming the registered ones
        entry_point = gym.spec(env_id).entry_point
        module_name = entry_point.__module__ if callable(entry_point) else str(entry_point).split(":")[0]
        try:
            digests[env_id] = _source_digest(module_name)
        except ImportError:
            continue  # not installed (e.g. an environment still being written): not covered
        ids.append(env_id)
    return ids, digests


def _source_digest(module_name: str) -> str:
    """Digest of a module's source. A module not imported yet is read from its file, not run: the
    cache key is computed at every start, and importing TextWorld's environment alone takes 1.5 s
    (an imported one, ``__main__`` say, is read as ``inspect`` finds it). ImportError when there is no
    such module."""
    try:
        if module_name in sys.modules:
            source = inspect.getsource(sys.modules[module_name])
        else:
            spec = importlib.util.find_spec(module_name)
            if spec is None:
                raise ImportError(f"no module named {module_name!r}")
            with tokenize.open(spec.origin) as file:  # decoded as inspect.getsource decodes it
                source = file.read()
    except (OSError, SyntaxError, TypeError):  # no source available (compiled module): the name stands in
        source = module_name
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def build_embedded_policy(directory: Path, config: dict[str, Any], env_ids: list[str]) -> None:
    """Train the tokenizer, initialize the model (seeded) and ``save_pretrained`` both to ``directory``."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from agent_rl.training.models.prompts import template_corpus

    settings = config["tokenizer"]
    texts = template_corpus() + sample_env_text(
        env_ids,
        episodes_per_env=settings["episodes_per_env"],
        overrides=settings.get("episodes_per_env_overrides", {}),
        random_steps=settings["random_steps_per_episode"],
        seed=config["init_seed"],
    )
    tokenizer = train_tokenizer(texts, vocab_size=settings["vocab_size"], min_frequency=settings["min_frequency"])
    special = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (("pad", PAD), ("bos", BOS), ("eos", EOS))}
    model_config = Qwen2Config(
        **config["model"],
        vocab_size=len(tokenizer),
        pad_token_id=special["pad"],
        bos_token_id=special["bos"],
        eos_token_id=special["eos"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config["init_seed"])
        model = Qwen2ForCausalLM(model_config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=special["bos"], eos_token_id=special["eos"], pad_token_id=special["pad"]
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "agent_rl_embedded.json").write_text(json.dumps({"env_ids": env_ids, "n_texts": len(texts)}, indent=2))


def train_tokenizer(texts: list[str], *, vocab_size: int, min_frequency: int = 2):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with the special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256} (specials + bytes), got {vocab_size}"
        )
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        model_max_length=int(2**31 - 1),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def sample_env_text(
    env_ids: list[str], *, episodes_per_env: int, overrides: dict[str, int], random_steps: int, seed: int
) -> list[str]:
    """Text the policy will read and write: per episode the task, observations along the oracle
    solution and along a few random admissible actions, the actions themselves and an error message.

    An environment that fails to construct or raises is skipped with a warning."""
    import gymnasium as gym

    rng = np.random.default_rng(seed)
    texts: list[str] = []
    for env_id in env_ids:
        env_texts: list[str] = []
        try:
            from agent_rl.envs import oracle_actions

            env = gym.make(env_id)
            for episode in range(overrides.get(env_id, episodes_per_env)):
                observation, info = env.reset(seed=seed + episode)
                env_texts += [info.get("task", ""), observation, *info.get("admissible_actions", [])]
                for action in oracle_actions(env):
                    observation, _, terminated, truncated, info = env.step(action)
                    env_texts += [action, observation]
                    if terminated or truncated:
                        break
                observation, info = env.reset(seed=seed + episode)
                for _ in range(random_steps):
                    actions = info.get("admissible_actions") or [GARBAGE_ACTION]
                    action = actions[rng.integers(len(actions))]
                    observation, _, terminated, truncated, info = env.step(action)
                    env_texts += [action, observation, *info.get("admissible_actions", [])]
                    if terminated or truncated:
                        break
                observation, *_ = env.step(GARBAGE_ACTION)
                env_texts.append(observation)
            env.close()
        except Exception as exc:  # one broken environment must not block the policy build
            warnings.warn(f"embedded tokenizer: skipping text of {env_id!r}: {type(exc).__name__}: {exc}")
            continue
        texts += [t for t in env_texts if t]
    return texts
