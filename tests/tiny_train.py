"""Overrides for the tests' one-iteration training runs (the environment tests, the docs' quickstart, a
user project; seconds with the embedded policy): no evaluation beyond two greedy episodes at the end,
no TensorBoard, one torch thread. A test adds what its run needs after them (the last value wins)."""

TINY_TRAIN = [
    "engine=hf",
    "trainer.iterations=1",
    "trainer.eval_every=0",
    "trainer.eval_episodes=2",
    "trainer.eval_sampled=false",
    "trainer.target_success=null",
    "trainer.confirm_episodes=0",
    "trainer.torch_threads=1",
    "rollout.n_groups=2",
    "rollout.group_size=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=6",
    "sft.steps=2",
    "sft.episodes=2",
    "sft.batch_size=4",
    "optim.minibatch_size=2",
    "rollout.min_batch_rows=0",
    "optim.micro_batch_size=4",
    "logging.console=false",
    "logging.tensorboard=false",
]
