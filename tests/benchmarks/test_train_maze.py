from agent_rl.benchmarks.train_maze import eval_curve

RECORDS = [
    {
        "iteration": 0,
        "eval/greedy_success": 0.97,
        "eval/confirm_greedy_success": 0.93,
        "eval/confirm_greedy_episodes": 96.0,
        "time/elapsed": 300.0,
    },
    {"iteration": 1, "rollout/success_rate": 0.9, "time/elapsed": 320.0},
    {"iteration": 2, "eval/greedy_success": 0.91, "time/elapsed": 345.0},
    {
        "iteration": 4,
        "eval/greedy_success": 0.97,
        "eval/confirm_greedy_success": 0.95,
        "eval/confirm_greedy_episodes": 128.0,
        "time/elapsed": 410.0,
    },
]


def test_eval_curve_keeps_evaluations_and_their_confirmations():
    assert eval_curve(RECORDS) == [
        {
            "iteration": 0,
            "greedy_success": 0.97,
            "confirm_greedy_success": 0.93,
            "confirm_greedy_episodes": 96.0,
            "elapsed_s": 300.0,
        },
        {
            "iteration": 2,
            "greedy_success": 0.91,
            "confirm_greedy_success": None,
            "confirm_greedy_episodes": None,
            "elapsed_s": 345.0,
        },
        {
            "iteration": 4,
            "greedy_success": 0.97,
            "confirm_greedy_success": 0.95,
            "confirm_greedy_episodes": 128.0,
            "elapsed_s": 410.0,
        },
    ]
