"""RELEASE (Ahn et al.): knob-space tuning of TVM templates with a cost model, simulated
annealing or a PPO agent as the search, greedy or adaptive (k-means) sampling.

- :mod:`.space`: layers (ResNet-18 conv2d at batch 1, matmul) and their knob spaces;
- :mod:`.template`: the TVM schedule of a configuration;
- :mod:`.measure`: build, check against NumPy, time (invalid configurations recorded);
- :mod:`.cost_model`: LightGBM trees refit after every batch;
- :mod:`.search`: AutoTVM's simulated annealing (the PPO agent is :class:`.study.RLSearch`);
- :mod:`.sampling`: greedy top-k + epsilon, adaptive sampling;
- :mod:`.env`: the knob walk as an env for RT programs;
- :mod:`.rounds`: one compiled program run round by round, paused by its env;
- :mod:`.tuner`: the measure / refit loop;
- :mod:`.study`: the four-combination study, ``python -m timerl.envs.release.study``.

See ``docs/release.md``.
"""
