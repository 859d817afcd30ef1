"""LoopTune (Grubisic et al.): loop-nest scheduling of matmul as an RL environment.

- :mod:`.ir`: the loop-tree state, the 10 cursor actions and the 20 features per loop;
- :mod:`.dataset`: the ``mm`` benchmark set and its train/test split;
- :mod:`.measure`: GFLOPS of a state (TVM compile-and-time, or an analytic model for tests);
- :mod:`.env`: ``trl.env.make("looptune.mm", num_envs=B, ...)``.
"""
