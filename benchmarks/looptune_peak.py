"""This core's float32 FMA peak, measured directly: the ceiling of any LoopTune schedule.

A C kernel (compiled here with ``gcc -O3 -march=native``, the chain loop fully unrolled) runs ``ACC`` independent
8-lane FMA chains (``_mm256_fmadd_ps``, or 16-lane ``_mm512_fmadd_ps`` where the CPU has
AVX-512) on registers only, no memory traffic, for ``ITERS`` iterations; its flops per
second are the most any matmul schedule can reach on one core. The best of ``--repeats``
short runs (about 0.5 ms each: on a shared machine the best short run is the one that
ran undisturbed, as in the TVM measurer) is reported, with the implied clock (``flop/s / (2 FMA pipes * lanes * 2)``) for
the 256-bit case.

    python benchmarks/looptune_peak.py [--repeats 500]

Compare with ``benchmarks/looptune_headroom.py`` (the best hand tiles) and the untuned
nest: the speedup any policy can reach on a problem is at most peak / untuned.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time

_SOURCE = r"""
#include <immintrin.h>
#define ACC 12
float run_avx2(long iters) {
    __m256 acc[ACC];
    __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int a = 0; a < ACC; a++) acc[a] = _mm256_set1_ps((float)a);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int a = 0; a < ACC; a++) acc[a] = _mm256_fmadd_ps(acc[a], x, y);
    }
    float out = 0.f, buf[8];
    for (int a = 0; a < ACC; a++) { _mm256_storeu_ps(buf, acc[a]); out += buf[0]; }
    return out;
}
#ifdef __AVX512F__
float run_avx512(long iters) {
    __m512 acc[ACC];
    __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int a = 0; a < ACC; a++) acc[a] = _mm512_set1_ps((float)a);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int a = 0; a < ACC; a++) acc[a] = _mm512_fmadd_ps(acc[a], x, y);
    }
    float out = 0.f, buf[16];
    for (int a = 0; a < ACC; a++) { _mm512_storeu_ps(buf, acc[a]); out += buf[0]; }
    return out;
}
int has_avx512(void) { return 1; }
#else
float run_avx512(long iters) { return 0.f; }
int has_avx512(void) { return 0; }
#endif
"""
ACC = 12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=500)
    ap.add_argument("--iters", type=int, default=50_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak.so")
        with open(src, "w") as f:
            f.write(_SOURCE)
        subprocess.run(["gcc", "-O3", "-march=native", "-shared", "-fPIC", src, "-o", lib], check=True)
        so = ctypes.CDLL(lib)
        for fn in (so.run_avx2, so.run_avx512):
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_long]
        kinds = [("avx2 (8 lanes)", so.run_avx2, 8)]
        if so.has_avx512():
            kinds.append(("avx512 (16 lanes)", so.run_avx512, 16))
        for label, fn, lanes in kinds:
            fn(1000)
            best = 0.0
            for _ in range(args.repeats):
                t = time.perf_counter()
                fn(args.iters)
                best = max(best, 2.0 * lanes * ACC * args.iters / (time.perf_counter() - t) / 1e9)
            ghz = best / 32.0  # two 256-bit FMA pipes: 32 float32 flop per cycle
            print(f"{label}: {best:.1f} GFLOPS (= {ghz:.2f} GHz x 32 flop/cycle)", flush=True)


if __name__ == "__main__":
    main()
