"""Run plumbing for training scripts: flags, logging, checkpoints, progress and metrics.

What a CleanRL / SB3 user expects around a training loop, so that an example script
imports only ``timerl``::

    @dataclass
    class Args(trl.run.RunArgs):          # --backend --seed --out-dir --quiet --show-schedule
        lr: float = 1e-3                  # --resume --checkpoint-every --checkpoint-dir
        \"\"\"Adam learning rate\"\"\"       # (this docstring is the --lr line of --help)

    args = trl.run.parse_args(Args, description="my agent")
    trl.run.setup_logging()
    ...                                   # the program, with a sink calling log_fn
    ex = trl.run.checkpoint_and_compile(ctx, args, dnn, i, bounds)
    log = trl.run.RunLog(args.out_dir, total=args.iterations, desc="PPO", quiet=args.quiet)
    def log_fn(v, pt):                    # a sink, once per iteration
        log.log(pt["i"], mean_return=..., env_steps=...)
    ex.execute()
    log.close(curve="mean_return")        # -> <out_dir>/learning_curve.png

``RunLog`` shows a progress bar with the time left (``tqdm``), appends every iteration's
metrics to ``metrics.csv``, writes them as TensorBoard events (``tensorboardX``;
``tensorboard --logdir <out_dir>``) and at the end plots a learning curve (``matplotlib``).
``--quiet`` drops the bar; ``--show-schedule`` writes the compiled schedule's picture
(``Executor.plot_schedule``) into the run directory. Scripts that report a table rather
than per-iteration metrics (evaluations) use ``progress`` (the bar alone) and ``write_csv``
(their results, one row per item), and write into their own files, not ``metrics.csv``.
"""

from timerl.run._agents import agent_settings as agent_settings
from timerl.run._agents import per_agent as per_agent
from timerl.run._args import RunArgs as RunArgs
from timerl.run._args import field_docs as field_docs
from timerl.run._args import parse_args as parse_args
from timerl.run._log import RunLog as RunLog
from timerl.run._log import progress as progress
from timerl.run._log import write_csv as write_csv
from timerl.run._program import checkpoint_and_compile as checkpoint_and_compile
from timerl.run._program import setup_logging as setup_logging
from timerl.run._program import show_schedule as show_schedule

__all__ = [
    "RunArgs",
    "RunLog",
    "agent_settings",
    "checkpoint_and_compile",
    "field_docs",
    "parse_args",
    "per_agent",
    "progress",
    "setup_logging",
    "show_schedule",
    "write_csv",
]
