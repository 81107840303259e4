"""The supervised warm start (training/loop/sft.py): demonstrations in both modes, perturbation, and the
supervised step."""

from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
import user_env_example  # noqa: F401  (registers usertest/Counter-v0)

from agent_rl.config import RolloutConfig
from agent_rl.envs import oracle_actions
from agent_rl.training.loop.sft import (
    Demonstrations,
    collect_demonstrations,
    listed_weights,
    scheduled_lr,
    supervised_step,
    train_supervised,
)
from agent_rl.training.models.prompts import PromptFormat, Turn
from agent_rl.training.serving.envpool import RegisteredEnv

COUNTER = RegisteredEnv("usertest/Counter-v0", {"max_target": 5, "max_steps": 40})


@pytest.fixture(scope="module")
def tokenizer(policy):
    return policy[1]


def _pairs(demos: Demonstrations, tokenizer):
    """(target, counter value, actions in the history, cloned action) of each Counter demonstration."""
    pairs = []
    for prompt, response in zip(demos.prompts, demos.responses):
        text = tokenizer.decode(prompt, skip_special_tokens=True)
        target = int(re.search(r"equal (\d+)", text).group(1))
        value = int(re.search(r"\[Current observation\]\s*The counter shows (-?\d+)", text).group(1))
        history = re.findall(r"\[Action \d+\]\s*(\w+)", text)
        pairs.append((target, value, history, tokenizer.decode(response, skip_special_tokens=True)))
    return pairs


def _counter_demonstrations(tokenizer, perturb: float, episodes: int = 20, epsilon: float = 0.0):
    config = RolloutConfig(max_turns=40, history_turns=40, max_prompt_tokens=2048)
    demos = collect_demonstrations(
        COUNTER,
        tokenizer,
        config,
        mode="oracle",
        seeds=range(episodes),
        rng=np.random.default_rng(0),
        perturb=perturb,
        epsilon=epsilon,
    )
    return demos, _pairs(demos, tokenizer)


def test_oracle_demonstrations_clone_the_plan(tokenizer):
    demos, pairs = _counter_demonstrations(tokenizer, perturb=0.0)
    assert demos.successes == demos.episodes == 20
    assert all(action == "inc" and history == ["inc"] * value for _, value, history, action in pairs)
    # One pair per step of each episode's plan: 0 -> target.
    assert len(pairs) == sum(target for target, value, _, _ in pairs if value == 0)
    # The response is the action then EOS, as an engine writes it.
    assert all(response[-1] == tokenizer.eos_token_id for response in demos.responses)


def test_perturbed_demonstrations_clone_the_oracle_from_where_a_random_action_led(tokenizer):
    demos, pairs = _counter_demonstrations(tokenizer, perturb=0.4)
    assert demos.successes == demos.episodes
    # Every cloned action is the oracle's from the state shown, even after detours ...
    assert all(action == ("inc" if value < target else "dec") for target, value, _, action in pairs)
    # ... and the histories hold random actions that were played but not cloned.
    assert any("dec" in history for _, _, history, _ in pairs)
    with pytest.raises(ValueError, match="perturb must be in"):
        _counter_demonstrations(tokenizer, perturb=1.0, episodes=1)


def test_epsilon_demonstrations_clone_random_admissible_actions_too(tokenizer):
    demos, pairs = _counter_demonstrations(tokenizer, perturb=0.0, epsilon=0.3)
    wrong = [action != ("inc" if value < target else "dec") for target, value, _, action in pairs]
    # Every turn is cloned (the history holds exactly the cloned actions) ...
    assert all(
        history == [a for t, v, h, a in pairs[i - len(history) : i]] for i, (_, _, history, _) in enumerate(pairs)
    )
    # ... about 30% are uniform draws of {inc, dec}, so about 15% go the wrong way, and the oracle
    # plans again from there: the episodes are still won.
    assert 0.08 < np.mean(wrong) < 0.25
    assert demos.successes == demos.episodes
    with pytest.raises(ValueError, match="epsilon must be in"):
        _counter_demonstrations(tokenizer, perturb=0.0, epsilon=1.5, episodes=1)


def test_random_demonstrations_clone_admissible_actions_in_the_rollout_format(tokenizer):
    config = RolloutConfig(max_turns=3, history_turns=1, parser="action_tag", system_prompt="")
    demos = collect_demonstrations(
        COUNTER, tokenizer, config, mode="random", seeds=[0, 1, 2], rng=np.random.default_rng(4)
    )
    assert len(demos) == 9 and demos.episodes == 3  # no Counter episode ends within 3 random steps of 5
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in demos.responses]
    assert set(texts) <= {"<action>inc</action>", "<action>dec</action>"} and len(set(texts)) == 2
    first = tokenizer.decode(demos.prompts[0])
    assert "<|system|>" not in first and "Admissible actions: inc | dec" in first


def _reference_demonstrations(
    make_env, tokenizer, config: RolloutConfig, mode: str, seeds, rng, perturb: float, epsilon: float
):
    """The warm start's demonstrations written as one plain loop over a single environment."""
    fmt = PromptFormat.from_rollout(config)
    env = make_env()
    prompts, responses = [], []
    for seed in seeds:
        observation, info = env.reset(seed=int(seed))
        plan = oracle_actions(env) if mode == "oracle" else []
        history: list[Turn] = []
        for _ in range(config.max_turns):
            admissible = info.get("admissible_actions")
            if mode == "oracle":
                if not plan:
                    break
                if perturb and rng.random() < perturb:
                    candidates = [*(admissible or []), *plan]
                    action = candidates[int(rng.integers(len(candidates)))]
                    history.append(Turn(observation, action))
                    observation, _, terminated, truncated, info = env.step(action)
                    if terminated or truncated:
                        break
                    plan = oracle_actions(env)
                    continue
                explore = epsilon and rng.random() < epsilon
                action = admissible[int(rng.integers(len(admissible)))] if explore else plan.pop(0)
            else:
                explore = False
                action = admissible[int(rng.integers(len(admissible)))]
            prompts.append(fmt.prompt_ids(tokenizer, info["task"], history, observation, admissible))
            responses.append(
                tokenizer(fmt.response_text(action), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            )
            history.append(Turn(observation, action))
            observation, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            if explore:
                plan = oracle_actions(env)
    return prompts, responses


def test_a_perturbed_turn_into_a_dead_state_ends_the_demonstration(tokenizer):
    """Sokoban: a random push can wedge the box where no plan wins; the oracle then has none ([]), and
    the demonstration ends there with its cloned turns, instead of the warm start failing."""
    sokoban = RegisteredEnv(
        "agent_rl/Sokoban-v0", {"width": 6, "height": 6, "n_boxes": 1, "reverse_steps": 40, "max_steps": 14}
    )
    config = RolloutConfig(max_turns=14, history_turns=0)
    demos = collect_demonstrations(
        sokoban, tokenizer, config, mode="oracle", seeds=range(40), rng=np.random.default_rng(0), perturb=0.5
    )
    assert demos.episodes == 40 and not demos.failures
    assert 0 < demos.successes < 40  # some perturbed episodes were left without a winning plan
    assert len(demos) > 0


@pytest.mark.parametrize(
    "mode, perturb, epsilon", [("oracle", 0.0, 0.0), ("oracle", 0.3, 0.0), ("oracle", 0.2, 0.5), ("random", 0.0, 0.0)]
)
def test_demonstrations_follow_the_seeds_and_random_draws_in_episode_order(tokenizer, mode, perturb, epsilon):
    """The episode loop plays demonstrations exactly as a plain per-episode loop does: same pairs,
    same order, the same random draws (Maze: locked doors, keys, dead ends)."""
    make_env = RegisteredEnv("agent_rl/Maze-v0", {"n_rooms": 4, "n_locked_doors": 1, "dead_ends": 1, "max_steps": 12})
    config = RolloutConfig(max_turns=10, history_turns=1)
    seeds = [3, 17, 29, 41]
    demos = collect_demonstrations(
        make_env,
        tokenizer,
        config,
        mode=mode,
        seeds=seeds,
        rng=np.random.default_rng(9),
        perturb=perturb,
        epsilon=epsilon,
    )
    prompts, responses = _reference_demonstrations(
        make_env, tokenizer, config, mode, seeds, np.random.default_rng(9), perturb, epsilon
    )
    assert len(demos) > len(seeds)
    assert demos.prompts == prompts and demos.responses == responses


class _BareTextEnv(gym.Env):
    """A plain Gymnasium text env: no admissible actions in ``info`` and no oracle."""

    observation_space = gym.spaces.Text(16)
    action_space = gym.spaces.Text(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return "start", 0.0, False, False, {}


@pytest.mark.parametrize(
    "mode, message",
    [
        ("oracle", "sft.mode=oracle needs an environment with an oracle\\(\\) method and _BareTextEnv has none"),
        (
            "random",
            "sft.mode=random needs info\\['admissible_actions'\\] at every turn, and the info "
            "_BareTextEnv's reset\\(\\) returned for turn 0 has none",
        ),
        ("expert", "SFT mode must be 'random' or 'oracle'"),
    ],
)
def test_demonstrations_name_what_the_environment_lacks(tokenizer, mode, message):
    with pytest.raises(ValueError, match=message):
        collect_demonstrations(
            _BareTextEnv, tokenizer, RolloutConfig(max_turns=2), mode=mode, seeds=[0], rng=np.random.default_rng(0)
        )


def _tiny_lm(vocab_size: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config)


def test_supervised_step_is_the_mean_token_cross_entropy_of_the_responses():
    model = _tiny_lm(20)
    prompts, responses = [[1, 2, 3], [4, 5]], [[6, 7], [8]]
    with torch.no_grad():
        expected = []
        for prompt, response in zip(prompts, responses):
            logits = model(torch.tensor([prompt + response])).logits[0]
            logp = torch.log_softmax(logits.float(), -1)
            expected += [-logp[len(prompt) - 1 + k, token] for k, token in enumerate(response)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss, accuracy = supervised_step(model, optimizer, prompts, responses)
    assert loss == pytest.approx(float(torch.stack(expected).mean()), rel=1e-5)
    assert 0.0 <= accuracy <= 1.0


def test_a_weighted_supervised_step_weights_each_rows_tokens():
    model = _tiny_lm(20)
    prompts, responses, weights = [[1, 2, 3], [4, 5], [4, 5]], [[6, 7], [8], [9]], [1.0, 0.25, 0.75]
    with torch.no_grad():
        nll = []
        for prompt, response in zip(prompts, responses):
            logp = torch.log_softmax(model(torch.tensor([prompt + response])).logits[0].float(), -1)
            nll.append([-float(logp[len(prompt) - 1 + k, token]) for k, token in enumerate(response)])
    # Row 0's two tokens at weight 1, rows 1 and 2's one token each at 0.25 and 0.75: 3 weighted tokens.
    expected = (sum(nll[0]) + 0.25 * nll[1][0] + 0.75 * nll[2][0]) / 3.0
    loss, _ = supervised_step(model, torch.optim.SGD(model.parameters(), lr=0.0), prompts, responses, "fp32", weights)
    assert loss == pytest.approx(expected, rel=1e-5)


def test_listed_weights_make_every_pair_weigh_one():
    assert listed_weights([1, 3, 2]).tolist() == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3, 0.5, 0.5])


def test_listed_targets_teach_each_drawn_turn_every_listed_action(monkeypatch):
    import agent_rl.training.loop.sft as sft

    calls = []
    step = sft.supervised_step

    def recording_step(model, optimizer, prompts, responses, precision, weights):
        calls.append((prompts, responses, list(weights)))
        return step(model, optimizer, prompts, responses, precision, weights)

    monkeypatch.setattr(sft, "supervised_step", recording_step)
    demos = Demonstrations(prompts=[[1, 2], [1, 3]], responses=[[5], [7]], episodes=2, successes=0)
    listed = [[[5], [6], [4]], [[7]]]  # turn 0 listed three actions (it played 5), turn 1 one
    train_supervised(
        _tiny_lm(8), demos, steps=1, lr=1e-3, batch_size=2, rng=np.random.default_rng(0), progress=False, listed=listed
    )
    ((prompts, responses, weights),) = calls
    rows = sorted(zip(map(tuple, prompts), map(tuple, responses), weights))
    assert rows == [((1, 2), (4,), 1 / 3), ((1, 2), (5,), 1 / 3), ((1, 2), (6,), 1 / 3), ((1, 3), (7,), 1.0)]


def test_listed_targets_clone_the_uniform_choice_over_each_turns_actions():
    model = _tiny_lm(10)
    demos = Demonstrations(prompts=[[1, 2], [1, 3]], responses=[[5], [8]], episodes=2, successes=0)
    listed = [[[5], [6]], [[7], [8], [9]]]
    train_supervised(
        model, demos, steps=150, lr=1e-2, batch_size=2, rng=np.random.default_rng(0), progress=False, listed=listed
    )
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([[1, 2], [1, 3]])).logits[:, -1].float(), -1)
    assert first[0, [5, 6]].tolist() == pytest.approx([0.5, 0.5], abs=0.05)
    assert first[1, [7, 8, 9]].tolist() == pytest.approx([1 / 3] * 3, abs=0.05)


def test_supervised_training_learns_a_fixed_reply():
    model = _tiny_lm(12)
    demos = Demonstrations(prompts=[[1, 2, 3], [1, 4], [5, 2, 2]], responses=[[9, 10]] * 3, episodes=3, successes=1)
    metrics = train_supervised(
        model, demos, steps=60, lr=1e-2, batch_size=2, rng=np.random.default_rng(0), progress=False
    )
    assert metrics["sft/token_accuracy"] == 1.0 and metrics["sft/loss"] < 0.1
    assert metrics["sft/pairs"] == 3 and metrics["sft/demo_success_rate"] == pytest.approx(1 / 3)
    assert not model.training
    with pytest.raises(ValueError, match="no SFT demonstrations"):
        train_supervised(
            model, Demonstrations([], [], 1, 0), steps=1, lr=1e-3, batch_size=1, rng=np.random.default_rng(0)
        )


def test_cosine_schedule_warms_up_then_decays_towards_zero():
    # 40 steps: a 2-step warmup, then half a cosine period over the remaining 38.
    assert [scheduled_lr(s, 40, 2.0, "cosine") for s in (0, 1, 2)] == [1.0, 2.0, 2.0]
    assert scheduled_lr(21, 40, 2.0, "cosine") == pytest.approx(1.0)  # a quarter period: cos(pi/2) = 0
    assert scheduled_lr(39, 40, 2.0, "cosine") == pytest.approx(1.0 + math.cos(math.pi * 37 / 38))
    decay = [scheduled_lr(s, 40, 2.0, "cosine") for s in range(2, 40)]
    assert all(a > b > 0 for a, b in zip(decay, decay[1:]))
    assert {scheduled_lr(s, 40, 2.0, "constant") for s in range(40)} == {2.0}
    assert scheduled_lr(0, 1, 2.0, "cosine") == 2.0  # one step is all warmup


def test_supervised_training_steps_with_the_scheduled_learning_rate(monkeypatch):
    import agent_rl.training.loop.sft as sft

    seen = []
    step = sft.supervised_step

    def recording_step(model, optimizer, *batch):
        seen.append(optimizer.param_groups[0]["lr"])
        return step(model, optimizer, *batch)

    monkeypatch.setattr(sft, "supervised_step", recording_step)
    demos = Demonstrations(prompts=[[1, 2], [3]], responses=[[4]] * 2, episodes=2, successes=2)
    train_supervised(
        _tiny_lm(8),
        demos,
        steps=40,
        lr=2.0,
        batch_size=1,
        rng=np.random.default_rng(0),
        schedule="cosine",
        progress=False,
    )
    assert seen == pytest.approx([scheduled_lr(s, 40, 2.0, "cosine") for s in range(40)])


@pytest.mark.parametrize("max_new_tokens, warned", [(1, True), (16, False)])
def test_warm_start_warns_when_demonstrated_replies_exceed_the_generation_limit(policy, max_new_tokens, warned):
    import copy

    from rich.console import Console

    from agent_rl.config import load_config
    from agent_rl.training.loop.sft import warm_start

    model, tokenizer = policy
    config = load_config(
        overrides=[
            "env.id=usertest/Counter-v0",
            "env.kwargs={max_target: 3, max_steps: 10}",
            "sft.mode=oracle",
            "sft.steps=1",
            "sft.episodes=2",
            "sft.batch_size=2",
            f"rollout.max_new_tokens={max_new_tokens}",
            "logging.console=false",
        ]
    )
    console = Console(record=True, width=400)
    metrics = warm_start(copy.deepcopy(model), tokenizer, COUNTER, config, console)
    # Every reply is an action plus the end-of-sequence token: at least 2 tokens, at most a few.
    assert metrics["sft/overlong_fraction"] == (1.0 if warned else 0.0)
    assert ("longer than rollout.max_new_tokens=1" in console.export_text()) == warned


# ---- DAgger: the clone plays, the oracle labels --------------------------------------------------


class _Scripted:
    """A policy stand-in that answers every prompt with one fixed command."""

    def __init__(self, tokenizer, action: str):
        self.tokenizer, self.action = tokenizer, action
        self.format = PromptFormat.from_rollout(RolloutConfig(max_turns=40, history_turns=40, max_prompt_tokens=2048))

    def act(self, episodes):
        from agent_rl.training.loop.rollout import Move

        return [
            Move(
                self.action,
                self.format.prompt_ids(self.tokenizer, e.task, e.history, e.observation, e.admissible_actions),
                [1, 2],
                [-0.5, -0.5],
            )
            for e in episodes
        ]


@pytest.mark.parametrize("played, won", [("dec", False), ("inc", True)])
def test_dagger_plays_the_policy_and_clones_the_oracle_from_where_it_led(tokenizer, played, won):
    from agent_rl.training.loop.rollout import PlayStats, play_episodes
    from agent_rl.training.loop.sft import OracleLabeller, demonstrations_of
    from agent_rl.training.serving.envpool import env_pool

    config = RolloutConfig(max_turns=6, history_turns=40, max_prompt_tokens=2048)
    policy = _Scripted(tokenizer, played)
    with env_pool(COUNTER, 3) as pool:
        episodes = play_episodes(
            pool, OracleLabeller(policy, pool, tokenizer, policy.format), [0, 1, 2], [0, 1, 2], config, PlayStats()
        )
    demos = demonstrations_of(episodes)
    pairs = _pairs(demos, tokenizer)
    # The history is what the policy played; every label is the oracle's move from there.
    assert all(history == [played] * len(history) for _, _, history, _ in pairs)
    assert all(action == ("inc" if value < target else "dec") for target, value, _, action in pairs)
    assert all(value == (len(history) if played == "inc" else -len(history)) for _, value, history, _ in pairs)
    assert len(demos) == sum(len(e.rows) for e in episodes)  # every turn had a plan, so every turn is labelled
    assert demos.successes == (3 if won else 0) and demos.episodes == 3


def test_dagger_does_not_label_a_turn_without_a_winning_plan(tokenizer):
    from agent_rl.training.loop.rollout import Episode
    from agent_rl.training.loop.sft import OracleLabeller
    from agent_rl.training.serving.envpool import OraclePlan

    class NoPlanForSlotZeroAndAFailureForSlotTwo:
        def oracle(self, slots):
            answers = {0: OraclePlan([]), 1: OraclePlan(["inc", "inc"]), 2: OraclePlan(failure="OSError: gone")}
            return [answers[slot] for slot in slots]

    policy = _Scripted(tokenizer, "dec")
    episodes = [Episode(slot, slot, 0, task="t", observation="o") for slot in range(3)]
    moves = OracleLabeller(policy, NoPlanForSlotZeroAndAFailureForSlotTwo(), tokenizer, policy.format).act(episodes)
    assert [m.action for m in moves] == ["dec", "dec", "dec"]  # the policy's action is played either way
    assert [m.learn for m in moves] == [False, True, False]
    assert tokenizer.decode(moves[1].response_ids, skip_special_tokens=True) == "inc"
    assert moves[1].response_ids[-1] == tokenizer.eos_token_id and list(moves[0].response_ids) == [1, 2]
    # The episode whose oracle call failed is failed (and finished); the others go on.
    assert [e.failure for e in episodes] == [None, None, "OSError: gone"]
    assert [e.finished for e in episodes] == [False, False, True]


def test_collect_dagger_plays_the_engine_greedily_in_batches(policy):
    from agent_rl.training.loop.sft import collect_dagger
    from agent_rl.training.serving.engines import HFEngine

    model, tokenizer = policy
    config = RolloutConfig(max_turns=3, history_turns=3, max_prompt_tokens=2048, max_new_tokens=4)
    demos = collect_dagger(COUNTER, HFEngine(model, tokenizer), tokenizer, config, seeds=[0, 1, 2, 3, 4], batch=2)
    prompts = [tokenizer.decode(prompt, skip_special_tokens=True) for prompt in demos.prompts]
    labels = [tokenizer.decode(response, skip_special_tokens=True) for response in demos.responses]
    assert demos.episodes == 5 and 5 <= len(demos) <= 15
    first_turns = [label for prompt, label in zip(prompts, labels) if "[Action" not in prompt]
    assert first_turns == ["inc"] * 5  # each episode starts at 0 below its target
    assert set(labels) <= {"inc", "dec"}  # whatever the untrained policy wrote, the labels are the oracle's
    with pytest.raises(ValueError, match="oracle"):
        collect_dagger(_BareTextEnv, HFEngine(model, tokenizer), tokenizer, config, seeds=[0], batch=1)


def test_supervised_training_draws_half_of_each_batch_from_the_dagger_pairs_after_the_round(monkeypatch):
    import agent_rl.training.loop.sft as sft

    batches, modes = [], []
    step = sft.supervised_step

    def recording_step(model, optimizer, prompts, responses, *rest):
        batches.append([prompt[0] for prompt in prompts])
        return step(model, optimizer, prompts, responses, *rest)

    monkeypatch.setattr(sft, "supervised_step", recording_step)
    demos = Demonstrations(prompts=[[1, 2], [1, 3], [1, 4], [1, 5]], responses=[[6]] * 4, episodes=4, successes=4)
    extra = Demonstrations(prompts=[[7, 2], [7, 3], [7, 4]], responses=[[6]] * 3, episodes=5, successes=2)
    model = _tiny_lm(8)

    def collect():
        modes.append(model.training)
        return extra

    metrics = train_supervised(
        model, demos, steps=6, lr=1e-3, batch_size=4, rng=np.random.default_rng(0), progress=False, dagger=(4, collect)
    )
    assert modes == [False]  # collected once, with the model in eval mode
    assert [sorted(b) for b in batches] == [[1, 1, 1, 1]] * 4 + [[1, 1, 7, 7]] * 2
    assert metrics["sft/dagger_pairs"] == 3 and metrics["sft/dagger_success_rate"] == pytest.approx(0.4)
    # Without a DAgger round the batches are drawn as before: one choice over the demonstrations per step.
    batches.clear()
    train_supervised(model, demos, steps=3, lr=1e-3, batch_size=2, rng=np.random.default_rng(5), progress=False)
    rng = np.random.default_rng(5)
    assert batches == [[demos.prompts[i][0] for i in rng.choice(4, size=2, replace=False)] for _ in range(3)]


def test_warm_start_runs_the_dagger_round_on_the_engine(policy):
    import copy

    from agent_rl.config import load_config
    from agent_rl.training.loop.sft import warm_start
    from agent_rl.training.serving.engines import HFEngine

    model, tokenizer = policy
    config = load_config(
        overrides=[
            "env.id=usertest/Counter-v0",
            "env.kwargs={max_target: 3, max_steps: 10}",
            "sft.mode=oracle",
            "sft.steps=3",
            "sft.episodes=2",
            "sft.batch_size=2",
            "sft.dagger_episodes=3",
            "sft.dagger_fraction=0.4",
            "rollout.max_turns=4",
            "logging.console=false",
        ]
    )
    clone = copy.deepcopy(model)
    metrics = warm_start(clone, tokenizer, COUNTER, config, engine=HFEngine(clone, tokenizer))
    assert metrics["sft/dagger_pairs"] >= 3 and 0.0 <= metrics["sft/dagger_success_rate"] <= 1.0
    with pytest.raises(ValueError, match="engine"):
        warm_start(clone, tokenizer, COUNTER, config)


# ---- the random warm start's stopping rules ------------------------------------------------------


def test_demonstrations_split_keeps_pairs_with_their_admissible_actions():
    demos = Demonstrations([[1], [2], [3], [4]], [[5], [6], [7], [8]], 4, 1, [["a"], ["b"], None, ["d"]])
    chosen, rest = demos.split(np.array([2, 0]))
    assert (chosen.prompts, chosen.responses, chosen.admissible) == ([[1], [3]], [[5], [7]], [["a"], None])
    assert (rest.prompts, rest.admissible, rest.episodes, rest.successes) == ([[2], [4]], [["b"], ["d"]], 4, 1)


class _Replies:
    """An engine that answers every prompt with the next of ``texts``, in turn."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls = tokenizer, texts, 0

    def generate(self, prompts, n, sampling):
        from agent_rl.training.serving.engines import Completion

        out = []
        for _ in prompts:
            ids = self.tokenizer(self.texts[self.calls % len(self.texts)], add_special_tokens=False)["input_ids"]
            self.calls += 1
            out.append([Completion(ids + [self.tokenizer.eos_token_id], [0.0] * (len(ids) + 1), "stop")])
        return out

    def update_weights(self, model):
        pass


def test_format_accuracy_is_the_share_of_replies_naming_an_action_of_the_game(tokenizer):
    """The game's actions are those the probes list anywhere: ``inc`` where only ``dec`` is legal (a
    move into a wall) is well formed, ``jump`` is not; a prompt that lists nothing is judged alike."""
    from agent_rl.training.loop.sft import format_accuracy

    probes = Demonstrations([[1, 2], [1, 3], [1, 4], [1, 5]], [[6]] * 4, 4, 0, [["inc", "dec"], ["inc"], ["dec"], None])
    engine = _Replies(tokenizer, ["inc", "jump", "inc", "dec"])
    assert format_accuracy(engine, tokenizer, RolloutConfig(), probes) == 0.75
    engine = _Replies(tokenizer, ["jump", "jump", "dec", "walk"])
    assert format_accuracy(engine, tokenizer, RolloutConfig(), probes) == 0.25


def _random_warm_start_config(*extra):
    from agent_rl.config import load_config

    return load_config(
        overrides=[
            "env.id=usertest/Counter-v0",
            "env.kwargs={max_target: 3, max_steps: 10}",
            "sft.mode=random",
            "sft.steps=200",
            "sft.episodes=60",
            "sft.batch_size=4",
            "rollout.max_turns=4",
            "logging.console=false",
            *extra,
        ]
    )


def test_the_random_warm_start_stops_at_the_first_check_that_reaches_the_format_target(policy, monkeypatch):
    import copy

    import agent_rl.training.loop.sft as sft

    model, tokenizer = policy
    measured = iter([0.2, 0.6, 0.96, 1.0])
    seen_probes = []

    def scripted(engine, tokenizer, config, probes):
        seen_probes.append(len(probes))
        return next(measured)

    monkeypatch.setattr(sft, "format_accuracy", scripted)
    metrics = sft.warm_start(
        copy.deepcopy(model), tokenizer, COUNTER, _random_warm_start_config("sft.format_target=0.95")
    )
    # Checks after 25, 50 and 75 steps; the third reaches 0.95.
    assert metrics["sft/steps_taken"] == 3 * sft.FORMAT_CHECK_EVERY and metrics["sft/format_accuracy"] == 0.96
    assert seen_probes == [sft.FORMAT_PROBES] * 3
    # The probes are held out of training: at most 60 episodes x 4 turns were cloned, less the 64 probes.
    assert 0 < metrics["sft/pairs"] <= 60 * 4 - sft.FORMAT_PROBES


def test_the_random_warm_start_clones_every_step_without_a_target_and_stops_at_the_time_bound(policy):
    import copy

    from agent_rl.training.loop.sft import warm_start

    model, tokenizer = policy
    full = warm_start(
        copy.deepcopy(model), tokenizer, COUNTER, _random_warm_start_config("sft.format_target=null", "sft.steps=30")
    )
    assert full["sft/steps_taken"] == 30 and "sft/format_accuracy" not in full
    bounded = warm_start(copy.deepcopy(model), tokenizer, COUNTER, _random_warm_start_config("sft.max_seconds=1e-9"))
    assert bounded["sft/steps_taken"] == 1  # the bound is checked after every step


def test_the_random_warm_start_with_listed_targets_teaches_every_listed_action(policy, monkeypatch):
    import copy

    import agent_rl.training.loop.sft as sft

    model, tokenizer = policy
    taught = []
    train = sft.train_supervised

    def recording_train(model, demos, **kwargs):
        taught.append((demos, kwargs["listed"]))
        return train(model, demos, **kwargs)

    monkeypatch.setattr(sft, "train_supervised", recording_train)
    config = _random_warm_start_config("sft.format_target=null", "sft.steps=2", "sft.targets=listed")
    sft.warm_start(copy.deepcopy(model), tokenizer, COUNTER, config)
    ((demos, listed),) = taught
    prompt_format = PromptFormat.from_rollout(config.rollout)
    assert listed == [[prompt_format.response_ids(tokenizer, a) for a in actions] for actions in demos.admissible]
    assert all(response in responses for response, responses in zip(demos.responses, listed))


@pytest.mark.parametrize("mode", ["oracle", "none"])
def test_listed_targets_need_the_random_warm_start(mode):
    from agent_rl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=f"'sft.targets': listed applies to sft.mode=random.*is {mode}"):
        load_config(overrides=[f"sft.mode={mode}", "sft.targets=listed"])


def test_a_small_demonstration_set_holds_out_half_of_its_pairs(policy, monkeypatch):
    import copy

    import agent_rl.training.loop.sft as sft

    model, tokenizer = policy
    seen_probes = []

    def scripted(engine, tokenizer, config, probes):
        seen_probes.append(len(probes))
        return 1.0

    monkeypatch.setattr(sft, "format_accuracy", scripted)
    metrics = sft.warm_start(copy.deepcopy(model), tokenizer, COUNTER, _random_warm_start_config("sft.episodes=2"))
    # 2 episodes of up to 4 turns: n pairs, n // 2 of them probes, the rest cloned.
    n = seen_probes[0] + metrics["sft/pairs"]
    assert 2 <= n <= 8 and seen_probes[0] == n // 2
    assert metrics["sft/steps_taken"] == sft.FORMAT_CHECK_EVERY
