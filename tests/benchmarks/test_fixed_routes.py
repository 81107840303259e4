"""The fixed-route census: which seeds a fixed action sequence wins, and which held-out episodes follow it."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from agent_rl.benchmarks.fixed_routes import (
    census,
    follows,
    main,
    parse_route,
    play_route,
    route_evaluation,
    route_plays,
    route_wins,
)


class TwoDoors(gym.Env):
    """Two steps: ``open`` then the door the seed hides the prize behind (``left`` on even seeds, ``right``
    on odd ones); any other second action loses, and an unknown first action keeps the episode going."""

    def reset(self, *, seed=None, options=None):
        self.prize, self.opened = ("left", "right")[seed % 2], False
        return "closed", {}

    def step(self, action):
        if not self.opened:
            self.opened = action == "open"
            return "open" if self.opened else "closed", 0.0, False, False, {}
        won = action == self.prize
        return "done", float(won), True, False, {"won": won}


def test_parse_route_splits_on_bars_and_names_an_empty_action():
    assert parse_route(" open | left ") == ("open", "left")
    with pytest.raises(ValueError, match="'open||left'"):
        parse_route("open||left")


@pytest.mark.parametrize(
    ("played", "expected"),
    [
        (["open"], True),
        (["open", "left"], True),
        (["open", "right"], False),
        (["open", "left", "x"], False),
        ([], False),
        (None, False),
    ],
)
def test_follows_means_a_prefix_of_the_route(played, expected):
    assert follows(played, ("open", "left")) is expected


def test_route_wins_stops_where_the_episode_ends():
    env = TwoDoors()
    assert route_wins(route_plays(env, ("open", "left"), [0, 1, 2, 3])) == [0, 2]
    assert route_wins(route_plays(env, ("open", "right", "left"), [0, 1, 2, 3])) == [1, 3]  # "left" never plays
    assert route_wins(route_plays(env, ("left", "open"), [0, 1])) == []  # the episode never ends


def test_census_counts_followers_their_route_wins_and_wins_off_every_route():
    routes = {"L": ("open", "left"), "R": ("open", "right")}
    wins = {"L": {0, 2}, "R": {1, 3}}
    transcripts = [
        {"seed": 0, "won": True, "actions": ["open", "left"]},
        {"seed": 1, "won": False, "actions": ["open", "left"]},
        {"seed": 2, "won": False, "actions": ["open", "right"]},
        {"seed": 3, "won": False, "actions": ["close", "open", "left"]},
        {"seed": 5, "won": True, "actions": ["wait", "open", "right"]},
    ]
    assert census(transcripts, routes, wins) == {
        "episodes": 5,
        "policy_wins": 2,
        "distinct_plays": 4,
        "routes": {"L": {"follows": 2, "route_wins_there": 1}, "R": {"follows": 1, "route_wins_there": 0}},
        "off_routes": {"episodes": 2, "policy_wins": 1},
    }


def test_main_writes_the_census_of_an_evaluation_file(tmp_path, monkeypatch):
    monkeypatch.setattr("agent_rl.benchmarks.fixed_routes.make_text_env", lambda env_id: TwoDoors())
    evaluation = tmp_path / "eval.json"
    shown = [{"seed": s, "won": s % 2 == 0, "actions": ["open", "left"]} for s in range(4)]
    evaluation.write_text(json.dumps({"greedy_transcripts": shown}))
    out = tmp_path / "census.json"
    assert (
        main(
            [str(evaluation), "--env", "two-doors", "--route", "open|left", "--route", "open|right", "--out", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["route_wins"] == {"open|left": 2, "open|right": 2} and result["any_route_wins"] == 4
    assert result["evaluations"][str(evaluation)]["routes"]["open|left"] == {"follows": 4, "route_wins_there": 2}


def test_main_names_a_missing_transcript_list(tmp_path, capsys):
    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({"greedy_success_rate": 0.5}))
    assert main([str(evaluation), "--env", "x", "--route", "a", "--out", str(tmp_path / "c.json")]) == 2
    assert "greedy_transcripts" in capsys.readouterr().err


def test_route_evaluation_is_what_an_evaluation_of_a_policy_playing_the_route_logs():
    # "open|left" wins the even seeds in two moves; on odd seeds it loses in two. "wait" never ends.
    env = TwoDoors()
    assert route_evaluation(route_plays(env, ("open", "left"), [0, 1, 2])) == {
        "success": pytest.approx(2 / 3),
        "length": 2.0,
        "action_entropy": 1.0,  # "open" and "left" half each
    }
    assert route_evaluation(route_plays(env, ("wait", "wait", "wait"), [0, 1])) == {
        "success": 0.0,
        "length": 3.0,
        "action_entropy": 0.0,
    }
    assert play_route(env, ("open", "right", "left"), 1) == (["open", "right"], True)  # stops where the episode ends


def test_main_replays_the_routes_on_held_out_seeds_without_evaluation_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("agent_rl.benchmarks.fixed_routes.make_text_env", lambda env_id: TwoDoors())
    out = tmp_path / "held_out.json"
    argv = ["--env", "two-doors", "--route", "open|left", "--out", str(out)]
    assert main([*argv, "--episodes", "4", "--eval-offset", "1"]) == 0
    result = json.loads(out.read_text())
    # Held-out seeds 2**31 + 1 .. 2**31 + 4: two even ones, which "open|left" wins.
    assert result["seeds"] == 4 and result["route_wins"] == {"open|left": 2} and result["evaluations"] == {}
    assert result["route_evaluations"]["open|left"] == {"success": 0.5, "length": 2.0, "action_entropy": 1.0}
    for wrong in ([], ["--episodes", "0"], [str(tmp_path / "eval.json"), "--episodes", "4"]):
        with pytest.raises(SystemExit):
            main([*argv, *wrong])
    assert "evaluation files or --episodes" in capsys.readouterr().err
