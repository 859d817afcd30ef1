#!/usr/bin/env bash
# The GPU path in one short run (the device machine of this workplace, or any CUDA machine).
#
# 1. what the machine has (GPU, JAX's devices);
# 2. PPO side by side on gymnax's JAX CartPole with JAX on the GPU: the single-jit PPO
#    against timerl's JAX backend (examples/ppo.py's program), 512 and 4096 envs x 250 steps;
# 3. the tests that run programs on the backends (backends, rt, runtime, pdg, reliability,
#    optim, gymnax env, agents, the PPO / REINFORCE / DQN programs) with JAX on the GPU;
# 4. a cProfile of examples/ppo.py (gymnax CartPole, 512 x 250, JAX backend) and its top entries.
#
# Wheels of packages the machine lacks (islpy, gymnasium, gymnax, tensorboardX) may be put in
# .whl/ (cp312 manylinux); they are installed into /tmp/site. Results go to $OUT (default
# runs/gpu_check). Each step has its own time limit, so one slow step does not eat the others'.
#
#   bash benchmarks/gpu_check.sh                      # everything, ~6-8 min on an H100/H200
#   STEPS=bench bash benchmarks/gpu_check.sh          # only the benchmark
set -u
OUT=${OUT:-runs/gpu_check}
STEPS=${STEPS:-env,bench,tests,profile}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

if [[ $STEPS == *env* ]]; then
  {
    nvidia-smi -L 2>&1 || echo "no nvidia-smi"
    nproc
    $PY -c "import jax, numpy; print('jax', jax.__version__, jax.devices(), 'numpy', numpy.__version__)"
    $PY -c "import timerl, islpy, gymnax; print('timerl imports; islpy', islpy.__version__)"
  } 2>&1 | tee "$OUT/env.txt"
fi

if [[ $STEPS == *bench* ]]; then
  for n in ${NUM_ENVS:-512 4096}; do
    $PY benchmarks/ppo_side_by_side.py --env gymnax --programs jax-jit,timerl-jax \
      --num-envs "$n" --num-steps "${NUM_STEPS:-250}" --iterations "${ITERS:-8}" --warmup 3 --timeout "${BENCH_LIMIT:-200}" \
      --out "$OUT/sbs$n" 2>&1 | tail -n 30
  done
fi

if [[ $STEPS == *tests* ]]; then
  set -o pipefail
  timeout "${TEST_LIMIT:-240}" $PY -m pytest -q -p no:cacheprovider ${PYTEST_XDIST:--n 12} \
    tests/backends tests/rt tests/runtime tests/pdg tests/reliability tests/optim tests/agents \
    tests/envs/test_gymnax_env.py tests/examples/test_ppo_program.py tests/examples/test_reinforce_program.py \
    tests/examples/test_dqn_program.py 2>&1 | tee "$OUT/tests.log" | tail -n 40
  set +o pipefail
fi

if [[ $STEPS == *profile* ]]; then
  timeout "${PROF_LIMIT:-150}" $PY -m cProfile -o "$OUT/ppo_jax.prof" examples/ppo.py --env-id gymnax.CartPole-v1 \
    --num-envs 512 --num-steps 250 --iterations "${PROF_ITERS:-20}" --backend jax --quiet --out-dir /tmp/ppo_prof 2>&1 | tail -n 4
  $PY -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(40)" "$OUT/ppo_jax.prof" \
    > "$OUT/ppo_jax_prof.txt" && head -n 60 "$OUT/ppo_jax_prof.txt"
fi
