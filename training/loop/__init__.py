"""The RL loop: the trainer, rollouts, the learner's update, the warm start and held-out evaluation."""
