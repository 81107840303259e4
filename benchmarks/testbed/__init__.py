"""The credit testbed's engine (``agent_rl.benchmarks.credit_testbed`` configures, runs and reports it): a
user-registered toy environment (:mod:`.corridor`), each task's state graph explored from the real
environment (:mod:`.explore`), rollouts simulated on those tables with numpy (:mod:`.simulator`), the
tabular policy gradient (:mod:`.learner`) and the exact success of a policy (:mod:`.exact`)."""
