"""The policy factory: embedded model build/cache/reload, local directories, no hub."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import agent_rl.training.models.embedded as embedded_module
from agent_rl.training.models.embedded import CHAT_TEMPLATE, train_tokenizer
from agent_rl.training.models.policy import PLAIN_CHAT_TEMPLATE, load_policy, policy_dir


@pytest.fixture(scope="module")
def embedded():
    """The embedded policy from the shared cache (built on first use)."""
    return load_policy("embedded")


def test_embedded_model_is_a_small_float32_qwen2(embedded):
    model, tokenizer = embedded
    assert model.config.model_type == "qwen2"
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 10_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "<|pad|>"


def test_embedded_chat_template_renders_and_round_trips(embedded):
    _, tokenizer = embedded
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "You are in the hall."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|bos|><|system|>\nbe brief<|end|>\n<|user|>\nYou are in the hall.<|end|>\n<|assistant|>\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for special in ("<|bos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"):
        assert tokenizer.convert_tokens_to_ids(special) in ids  # one token each, never split
    assert tokenizer.decode(ids) == text


def test_embedded_tokenizer_is_trained_on_environment_text(embedded):
    model, tokenizer = embedded
    covered = json.loads((policy_dir("embedded") / "agent_rl_embedded.json").read_text())["env_ids"]
    assert "agent_rl/Maze-v0" in covered
    game_text = "You are in the dusty nursery.\nExits: north, east, south (locked door), west."
    ids = tokenizer(game_text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == game_text
    assert len(ids) < len(game_text) / 3  # byte level would be 1 token per character


def test_embedded_directory_reloads_identically(embedded, tmp_path):
    model, tokenizer = embedded
    again, tokenizer_again = load_policy(policy_dir("embedded"))
    assert tokenizer_again.get_vocab() == tokenizer.get_vocab()
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_build_is_cached_reproducible_and_locked(tmp_path, monkeypatch):
    # One real build into a fresh cache; concurrent callers wait for it instead of building again.
    builds = []
    real_build = embedded_module.build_embedded_policy
    monkeypatch.setattr(embedded_module, "build_embedded_policy", lambda *a: (builds.append(1), real_build(*a)))
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(policy_dir("embedded", cache_dir=tmp_path))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(set(results)) == 1
    directory = results[0]
    assert directory.parent == tmp_path and directory.name.startswith("embedded-")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging leftovers
    # The seeded build is reproducible: same key, same weights as the shared cache's copy.
    assert directory.name == policy_dir("embedded").name
    fresh, _ = load_policy(directory)
    shared, _ = load_policy("embedded")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), shared.state_dict().values()))


def test_the_cache_key_digests_each_module_source_without_importing_the_environments(monkeypatch):
    # The digest inspect.getsource gives (the key of every cache built before), for an imported module
    # and, read from its file, for one not imported (which stays so).
    import hashlib
    import importlib
    import inspect
    import subprocess
    import sys

    for name in ("agent_rl.envs.maze", "agent_rl.envs.textworld_env", "agent_rl.training.models.prompts"):
        expected = hashlib.sha256(inspect.getsource(importlib.import_module(name)).encode()).hexdigest()[:16]
        assert embedded_module._source_digest(name) == expected
        monkeypatch.delitem(sys.modules, name)
        assert embedded_module._source_digest(name) == expected and name not in sys.modules
    with pytest.raises(ImportError):
        embedded_module._source_digest("agent_rl.envs.no_such_env")
    # A start that finds the policy in the cache does not import TextWorld (1.5 s of every start).
    check = (
        "import sys; from agent_rl.training.models.policy import policy_dir; policy_dir('embedded'); "
        "sys.exit('agent_rl.envs.textworld_env' in sys.modules or 'textworld' in sys.modules)"
    )
    policy_dir("embedded")  # built on a cold cache
    assert subprocess.run([sys.executable, "-c", check], timeout=120).returncode == 0


def test_tokenizer_training_is_deterministic():
    corpus = ["go north", "take the amber key", "You are in the hall."] * 30
    a = train_tokenizer(corpus, vocab_size=300, min_frequency=1)
    b = train_tokenizer(corpus, vocab_size=300, min_frequency=1)
    assert a.get_vocab() == b.get_vocab() and a.chat_template == CHAT_TEMPLATE
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(corpus, vocab_size=100)


def test_missing_path_and_hub_ids_raise_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="hub downloads are disabled"):
        load_policy(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="Qwen/Qwen2.5-0.5B-Instruct"):
        load_policy("Qwen/Qwen2.5-0.5B-Instruct")


def test_local_directory_uses_its_own_chat_template(embedded, tmp_path):
    model, tokenizer = embedded
    own = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "chat_template.jinja").write_text(own)
    _, loaded = load_policy(tmp_path)
    assert loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi\n"
    # A base model without any template gets the plain one.
    (tmp_path / "chat_template.jinja").unlink()
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    _, plain = load_policy(tmp_path)
    assert plain.chat_template == PLAIN_CHAT_TEMPLATE
    assert plain.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    ) == ("### user:\nhi\n\n### assistant:\n")


def test_tokenizer_env_ids_add_to_the_bundled_games_once():
    from agent_rl.training.models.embedded import POLICY_CONFIG, tokenizer_env_ids

    bundled = json.loads(POLICY_CONFIG.read_text())["tokenizer"]["envs"]
    assert tokenizer_env_ids([]) is None and tokenizer_env_ids(bundled[:1]) is None  # the default model
    assert tokenizer_env_ids(["usertest/Counter-v0", bundled[0], "usertest/Counter-v0"]) == [
        *bundled,
        "usertest/Counter-v0",
    ]


def test_an_embedded_tokenizer_covering_a_user_env_spends_fewer_tokens_on_its_text(embedded, tmp_path):
    import user_env_example  # noqa: F401  (registers usertest/Counter-v0)

    from agent_rl.training.models.embedded import tokenizer_env_ids

    directory = policy_dir("embedded", cache_dir=tmp_path, env_ids=tokenizer_env_ids(["usertest/Counter-v0"]))
    assert directory.name != policy_dir("embedded").name
    assert "usertest/Counter-v0" in json.loads((directory / "agent_rl_embedded.json").read_text())["env_ids"]
    _, covering = load_policy(directory)
    text = "Make the counter equal 4. The counter shows 3."
    default_ids = embedded[1](text, add_special_tokens=False)["input_ids"]
    covering_ids = covering(text, add_special_tokens=False)["input_ids"]
    assert covering.decode(covering_ids) == text
    assert len(covering_ids) < len(default_ids)


def test_tokenizer_envs_need_the_embedded_policy():
    from agent_rl.config import ConfigError, load_config

    assert load_config(overrides=["policy.tokenizer_envs=[textarena/FrozenLake-v0]"]).policy.tokenizer_envs == [
        "textarena/FrozenLake-v0"
    ]
    with pytest.raises(ConfigError, match="policy.tokenizer_envs"):
        load_config(overrides=["policy=smollm2-135m-instruct", "policy.tokenizer_envs=[textarena/FrozenLake-v0]"])
