# The stack-alignment effect behind the "two-speed" configurations: one built
# configuration timed (CPU clock, min of 20 repeats) in this process's main thread, in fresh
# threads, and in a fresh thread at stack offsets 0, 16, ..., (--step) below its start
# (`timerl.envs.release.measure.padcall`), then by the default measurer (fresh thread, the
# fastest of offsets 0, 16, 32, 48). Run it in several processes: the main-thread speed changes
# from process to process, the others do not.
#
#   OMP_NUM_THREADS=1 TVM_NUM_THREADS=1 python benchmarks/release_stack.py                 # C2's and C12's
#   python benchmarks/release_stack.py --layer C2 --config 3,0,7,0,0,0,0,1,0,1 --step 16 --span 128
#   python benchmarks/release_stack.py --step 256 --span 4096 --page   # across a page, and a
#       measurer whose offsets span the page (0/16/32/48 at 0, 1024, 2048, 3072: 16 offsets, same budget)
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

from timerl.envs.release import measure as rm  # noqa: E402
from timerl.envs.release import template  # noqa: E402
from timerl.envs.release.space import layer, template_space  # noqa: E402

PAGE = tuple(p + o for p in (0, 1024, 2048, 3072) for o in (0, 16, 32, 48))
TWO_SPEED = {  # the first initial configuration of C12 seed 0, the second of C2 seed 0
    "C12": (3, 1, 1, 3, 0, 1, 0, 1, 1, 0),
    "C2": (3, 0, 7, 0, 0, 0, 0, 1, 0, 1),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--layer", default="", help="one layer (default: C2 and C12 with their two-speed configurations)"
    )
    p.add_argument("--config", default="", help="knob indices, comma-separated")
    p.add_argument("--step", type=int, default=16)
    p.add_argument("--span", type=int, default=64)
    p.add_argument("--page", action="store_true", help="also time with offsets spanning a 4 KiB page")
    a = p.parse_args()
    todo = (
        {a.layer: tuple(int(x) for x in a.config.split(","))} if a.layer else TWO_SPEED
    )  # layer -> configuration
    caller = rm.TemplateMeasurer(thread="caller", stack_offsets=(0,))
    fresh = rm.TemplateMeasurer(stack_offsets=(0,))
    default = rm.TemplateMeasurer()
    page = rm.TemplateMeasurer(stack_offsets=PAGE) if a.page else None
    out = {}
    for name, cfg in todo.items():
        sp = template_space(layer(name))
        out[name] = timings(
            sp, template.build(sp, cfg, caller.target), caller, fresh, default, a.step, a.span, page
        )
        print(name, cfg, json.dumps(out[name]), flush=True)


def timings(sp, lib, caller, fresh, default, step: int, span: int, page=None) -> dict:
    def g(m: rm.TemplateMeasurer) -> float:
        return round(m.time_lib(sp.layer, lib), 1)

    def timed(m: rm.TemplateMeasurer) -> list[float]:  # GFLOPS, seconds of the timing
        t = time.perf_counter()
        gf = g(m)
        return [gf, round(time.perf_counter() - t, 3)]

    extra = {}
    if page is not None:
        extra = {
            "default [GFLOPS, s]": [timed(default) for _ in range(3)],
            "page [GFLOPS, s]": [timed(page) for _ in range(3)],
        }
    return extra | {
        "main thread": [g(caller) for _ in range(3)],
        "fresh threads": [g(fresh) for _ in range(3)],
        "offsets": {
            o: rm.in_fresh_thread(lambda o=o: rm.padcall(o, lambda: g(caller))) for o in range(0, span, step)
        },
        "default measurer": g(default),
    }


if __name__ == "__main__":
    main()
