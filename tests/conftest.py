"""Test-suite settings.

* ``TIMERL_VERIFY_PASSES=1``: verify the PDG after every compiler pass
  (``timerl.compile.build_pdg``).
* One thread per process for PyTorch and XLA: the suite runs one worker per core
  (``pytest -n auto``, pytest-xdist); several intra-op threads per worker would fight over
  the same cores.
* One JAX compilation cache for the run (all workers): a fused region that several tests
  (or several compiles of one test) lower to the same XLA program is compiled once. The
  cache lives in a temporary directory made for the run, so no run reads another's.
* XLA's backend optimisations off (``JAX_DISABLE_MOST_OPTIMIZATIONS``): the tests check what
  timerl computes, on tiny shapes, so compiling is most of a JAX test's time; LLVM's
  optimisation passes halve it. Benchmarks and users run with XLA's defaults. Set
  ``JAX_DISABLE_MOST_OPTIMIZATIONS=false`` to test with them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TIMERL_VERIFY_PASSES", "1")
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the first process (xdist's controller) makes it
    _cache = tempfile.mkdtemp(prefix="timerl-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_configure(config: object) -> None:
    import torch

    torch.set_num_threads(1)
