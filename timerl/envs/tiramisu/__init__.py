"""A Tiramisu-style polyhedral loop-optimisation environment (``papers/tiramisu_rl.txt``).

- :mod:`.program`: loop-nest programs (isl domains, affine accesses, 2d+1 loop structure);
- :mod:`.benchmarks`: the paper's 8 benchmark functions; :mod:`.generator`: random nests;
- :mod:`.schedule`: schedules and the transformations; :mod:`.actions`: the 84 actions
  (the paper's 56 and 28 added);
- :mod:`.legality`: exact isl dependences and legality of a schedule;
- :mod:`.codegen`: isl AST -> C (OpenMP / unroll pragmas); :mod:`.measure`: gcc, check, time;
- :mod:`.features`: the padded AST graph; :mod:`.env`: ``trl.env.make("tiramisu.<set>")``;
- :mod:`.search`: beam / random search baselines;
- :mod:`.evaluate`: the agent against beam and random search and the hand schedules,
  ``python -m timerl.envs.tiramisu.evaluate``.
"""
