"""ScienceWorldEnv on ScienceWorld's Java simulator: the checker, task names, seeds and held-out
variations, the gold-path oracle, rewards, the shown-action rule, what reaches the simulator, and the
Java process (death mid-episode, a missing java, close)."""

from __future__ import annotations

import random
import re
import shutil

import gymnasium as gym
import pytest

from agent_rl.envs import EVAL_SEED_BASE, EnvUnavailableError, check_text_env, oracle_actions
from agent_rl.envs.checker import HOSTILE_ACTIONS

pytest.importorskip("scienceworld")

from agent_rl.envs.scienceworld_env import (
    ALWAYS_SHOWN,
    ScienceWorldEnv,
    check_simplifications,
    resolve_task,
    task_names,
)  # noqa: E402

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld's simulator needs Java")


@pytest.fixture(scope="module")
def env():
    """One Java process for the module (starting one takes about 3 s)."""
    if shutil.which("java") is None:
        pytest.skip("ScienceWorld's simulator needs Java")
    environment = ScienceWorldEnv(task="find-plant")
    yield environment
    environment.close()


@pytest.mark.slow
def test_checker_passes(env):
    assert check_text_env(env, seeds=(0, 1), n_steps=8).checks[-1] == "usable_after_fuzz"


def test_task_names_ids_and_indices():
    names = task_names()
    assert len(names) == 30 and names[0] == "boil" and names[-1] == "mendelian-genetics-unknown-plant"
    assert (
        resolve_task(0) == "boil"
        and resolve_task("4-3") == "find-plant"
        and resolve_task(" find-plant ") == "find-plant"
    )
    assert resolve_task("Matter Changes of State (Boiling)") == "boil"  # the paper's name


@pytest.mark.parametrize("bad", ["find-a-unicorn", 30, -1, None])
def test_unknown_task_lists_the_valid_ones(bad):
    with pytest.raises(ValueError) as err:
        resolve_task(bad)
    assert "0=boil" in str(err.value) and "13=find-plant" in str(err.value)


def test_simplifications_are_checked():
    assert check_simplifications("boil", "teleportAction, openDoors") == "teleportAction,openDoors"
    with pytest.raises(ValueError, match="unknown ScienceWorld simplification 'fly'.*openDoors"):
        check_simplifications("boil", "fly")
    with pytest.raises(ValueError, match="needs electrical actions"):
        check_simplifications("power-component", "noElectricalAction")
    with pytest.raises(ValueError, match="'easy' preset cannot be combined"):  # ScienceWorld would fail at load
        check_simplifications("boil", "easy,openContainers")


def test_missing_java_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on PATH
    with pytest.raises(
        EnvUnavailableError, match=r"no `java` executable was found on PATH.*apt-get install default-jre-headless"
    ):
        ScienceWorldEnv(task="boil")
    with pytest.raises(EnvUnavailableError):
        gym.make("agent_rl/ScienceWorld-v0")


@pytest.mark.slow
def test_seeds_are_deterministic_across_processes(env):
    other = gym.make("agent_rl/ScienceWorld-v0", task="find-plant")  # a second Java process
    for seed in (3, EVAL_SEED_BASE + 3):
        first, second = env.reset(seed=seed), other.reset(seed=seed)
        assert first == second
        info, chooser = first[1], random.Random(seed)
        for _ in range(4):
            action = chooser.choice(info["admissible_actions"][4:])  # past look/inventory/wait
            first, second = env.step(action), other.step(action)
            assert first == second
            info = first[4]
    other.close()


@pytest.mark.slow
def test_training_seeds_play_train_variations_and_evaluation_seeds_dev_or_test(env):
    splits = env.splits
    assert len(splits["train"]) and not set(splits["train"]) & (set(splits["dev"]) | set(splits["test"]))
    train = {env.reset(seed=seed)[1]["variation"] for seed in range(10)}
    dev = {env.reset(seed=EVAL_SEED_BASE + i)[1]["variation"] for i in range(10)}
    assert train <= set(splits["train"]) and dev <= set(splits["dev"]) and len(train) > 5 and len(dev) > 5
    assert env.instance_key() == f"find-plant|easy|{env.variation}"
    test_split = ScienceWorldEnv(task="find-plant", eval_split="test")
    assert {test_split.reset(seed=EVAL_SEED_BASE + i)[1]["variation"] for i in range(3)} <= set(splits["test"])
    assert test_split.reset(seed=0)[1]["variation"] in splits["train"]
    test_split.close()


@pytest.mark.slow
def test_oracle_wins_and_rewards_sum_to_the_score(env):
    for seed in (0, EVAL_SEED_BASE):
        _, info = env.reset(seed=seed)
        start_score = info["score"]
        total = 0.0
        for action in oracle_actions(env):
            _, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"], (action, info["error"])
            total += reward
        assert terminated and not truncated and info["won"] and info["score"] == 100
        assert total == pytest.approx((100 - start_score) / 100)


@needs_java
@pytest.mark.slow
@pytest.mark.parametrize("task", ["use-thermometer", "boil", "chemistry-mix-paint-secondary-color", "power-component"])
def test_oracle_wins_other_tasks(task):
    environment = ScienceWorldEnv(task=task)
    for seed in (0, 1):
        environment.reset(seed=seed)
        for action in environment.oracle():
            _, _, terminated, _, info = environment.step(action)
        assert terminated and info["won"], (task, seed)
    environment.close()


def test_oracle_continues_after_looking_and_restarts_after_a_detour(env):
    env.reset(seed=5)
    plan = env.oracle()
    env.step(plan[0])
    assert env.oracle() == plan[1:]
    env.step("look around")  # changes nothing: still on the gold path
    env.step("inventory")
    assert env.oracle() == plan[1:]
    detour = next(a for a in env.admissible_actions() if a.startswith("teleport to ") and a not in plan[:3])
    _, _, _, _, info = env.step(detour)
    assert info["action_valid"]
    assert env.oracle() == plan  # the gold path cannot re-plan: the whole path from the start


@needs_java
@pytest.mark.slow
def test_an_ambiguous_action_asks_which_one_and_the_numbers_answer():
    environment = ScienceWorldEnv(task="grow-plant", max_steps=1000)
    environment.reset(seed=0)
    plan = environment.oracle()  # its gold path answers a question with "0"
    asked = plan.index("0") - 1
    for action in plan[:asked]:
        environment.step(action)
    anchor = environment.anchor()
    observation, _, _, _, info = environment.step(plan[asked])
    assert info["action_valid"] and observation.startswith("Ambiguous request: Please enter the number")
    options = info["admissible_actions"]
    assert options[:2] == ["0", "1"] and options == [str(i) for i in range(len(options))] and info["anchor"] != anchor
    observation, _, _, _, info = environment.step(
        "look around"
    )  # not a number: cancels the question, as in ScienceWorld
    assert not info["action_valid"] and info["error"].startswith("Unknown action.")
    assert observation.startswith("That cancelled ScienceWorld's question")
    assert info["admissible_actions"][0] == "inventory"
    environment.step(plan[asked])
    _, _, _, _, info = environment.step("0")
    assert info["action_valid"] and info["admissible_actions"][0] == "inventory"
    environment.reset(seed=0)
    for action in environment.oracle():
        *_, terminated, _, info = environment.step(action)
        if terminated:
            break
    assert info["won"]
    environment.close()


def test_failing_the_task_terminates_without_a_win(env):
    _, info = env.reset(seed=2)
    wrong = next(
        a for a in info["admissible_actions"] if a.startswith("focus on ") and "plant" not in a and "tree" not in a
    )
    _, reward, terminated, _, info = env.step(wrong)  # focusing on a non-plant fails find-plant
    assert terminated and not info["won"] and info["score"] < 0
    assert reward == pytest.approx(-8 / 100)  # from the first look's 8 points (of 100) down to 0: scores clip at 0


@pytest.mark.slow
def test_shown_actions_follow_the_rule(env):
    _, info = env.reset(seed=7)
    shown, valid = info["admissible_actions"], env.valid_actions()
    assert len(shown) == 50 < info["valid_action_count"] == len(valid)
    assert shown[:4] == sorted(ALWAYS_SHOWN) and set(shown) <= set(valid)
    assert not {"task", "reset task"} & set(shown)
    assert not [a for a in shown[4:] if a.split()[-1] in ("agent", "air", "inventory")]
    rooms = [a for a in shown if a.startswith("teleport to ")]
    assert len(rooms) == 10 and shown[4 : 4 + len(rooms) + 1][-1].startswith("teleport to ")  # rooms come next
    for action in shown[::4]:  # shown actions are accepted by ScienceWorld (a sample, each from the start state)
        env.reset(seed=7)
        assert env.step(action)[4]["action_valid"], action
    everything = ScienceWorldEnv(task="find-plant", max_shown_actions=None)
    _, all_info = everything.reset(seed=7)
    assert all_info["admissible_actions"][:50] == shown and len(all_info["admissible_actions"]) > 50
    everything.close()


def test_actions_on_task_objects_come_right_after_moving(env):
    _, info = env.reset(seed=1)  # find-plant: "... move it to the <color> box in the <room>"
    color, room = re.search(r"move it to the (\w+) box in the ([\w ]+)\.", info["task"]).groups()
    _, _, _, _, info = env.step(f"teleport to {room}")
    task_words = {"find", "plant", color, "box", *room.split()}
    shown = info["admissible_actions"]
    after_moves = [a for a in shown[4:] if not a.startswith(("teleport to ", "go to "))]
    on_task = [bool(task_words & set(a.split())) for a in after_moves]
    assert on_task[0] and on_task == sorted(on_task, reverse=True)  # all task-object actions first
    assert f"focus on {color} box" in after_moves[: on_task.count(True)]


def test_hostile_input_never_reaches_the_simulator(env, monkeypatch):
    env.reset(seed=0)
    sent = []
    original = env._call
    monkeypatch.setattr(
        env,
        "_call",
        lambda method, *args: (sent.append(args[0]) if method == "step" else None, original(method, *args))[1],
    )
    for action in [*HOSTILE_ACTIONS, "reset task", "reset", "look", "focus on the unicorn", "task"]:
        _, _, terminated, _, info = env.step(action)
        assert not terminated
        if action != "task":
            assert not info["action_valid"], action
    # only ASCII words of two or more (or a listed action like "task") got through to ScienceWorld's parser
    assert all(c.split()[0] != "reset" and (len(c.split()) >= 2 or c == "task" or c == "") for c in sent)
    assert "reset task" not in sent and "look" not in sent and "quit" not in sent
    assert "focus on the unicorn" in sent  # well-formed: ScienceWorld's parser decides, and says no


def test_java_death_fails_the_step_and_the_next_reset_recovers(env):
    env.reset(seed=4)
    process = env._gateway.java_process
    process.kill()
    process.wait()
    with pytest.raises(RuntimeError, match="Java process stopped.*next reset\\(\\) starts a new process"):
        env.step("look around")
    assert env._gateway is None
    _, info = env.reset(seed=4)
    assert env._gateway.java_process.pid != process.pid and env._gateway.java_process.poll() is None
    assert env.step("look around")[4]["action_valid"]


@needs_java
def test_close_stops_the_java_process():
    environment = ScienceWorldEnv(task="find-plant")
    process = environment._gateway.java_process
    environment.close()
    assert process.poll() is not None
    environment.close()  # twice is fine


@needs_java
@pytest.mark.slow
def test_one_training_iteration_through_the_cli(tmp_path):
    from tiny_train import TINY_TRAIN  # tests/

    from agent_rl.cli import main
    from agent_rl.config import load_config
    from agent_rl.training.infra.logger import read_metrics

    run_dir = tmp_path / "scienceworld"
    overrides = [*TINY_TRAIN, "rollout.n_groups=1", "sft.episodes=1"]  # every environment is a Java process
    assert (
        main(
            [
                "train",
                "env.id=agent_rl/ScienceWorld-v0",
                "env.kwargs={task: find-plant, max_steps: 4}",
                f"trainer.run_dir={run_dir}",
                *overrides,
            ]
        )
        == 0
    )
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1] and records[0]["sft/pairs"] > 0
    assert load_config(run_dir / "config.yaml").sft.mode == "oracle"  # auto: the gold path
