"""The memory timeline (``CompileOptions(memory_timeline=True)``, ``executor.memory_timeline()``):
live bytes per pool sampled at every put and free, consistent with the store's accounting."""

from __future__ import annotations

import pytest
from test_dealloc import nstep_program


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_timeline_matches_the_accounting(backend: str) -> None:
    ctx, bounds = nstep_program(40, 8, lambda v, p: None)
    ex = ctx.compile(bounds, backend=backend, memory_timeline=True)
    ex.execute()
    tl = ex.memory_timeline()
    st = ex.memory_stats()
    assert tl is not None and len(tl.seconds) > 40
    assert list(tl.seconds) == sorted(tl.seconds)
    assert max(tl.total()) == st.peak_bytes
    assert tl.total()[-1] == st.live_bytes
    assert max(tl.pool("device")) == st.pool("device").peak_bytes
    assert set(tl.pool("host")) == {0}  # nothing is put in host memory yet
    # frees: the live bytes go down as well as up
    tot = tl.total()
    assert any(b < a for a, b in zip(tot, tot[1:], strict=False))
    ex.execute()  # a new run starts a new timeline
    assert ex.memory_timeline().seconds[0] == 0.0 and max(ex.memory_timeline().total()) == st.peak_bytes


def test_timeline_off_by_default() -> None:
    ctx, bounds = nstep_program(10, 8, lambda v, p: None)
    ex = ctx.compile(bounds, backend="torch")
    ex.execute()
    assert ex.memory_timeline() is None
