"""TVM MetaSchedule on a RELEASE conv2d layer (:mod:`timerl.envs.release.metaschedule`): a
tiny layer, a few trials; its best schedule is checked against NumPy and timed by the knob
tuners' measurer. Marked ``slow`` (about 2 minutes at load 5, mostly MetaSchedule's
builder and runner pools): run with ``pytest -m slow``."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.space import Layer


@pytest.mark.slow
def test_metaschedule_tunes_a_conv2d_layer(tmp_path) -> None:
    for mod in ("xgboost", "cloudpickle", "psutil"):  # the metaschedule extra
        pytest.importorskip(mod)
    from timerl.envs.release.metaschedule import layer_module, tune_layer

    lay = Layer.conv2d("tiny_conv_ms", 4, 8, 6, 3, 1, 1)
    assert "main" in [gv.name_hint for gv in layer_module(lay).get_global_vars()]
    measurer = TemplateMeasurer()
    res = tune_layer(lay, trials=4, measurer=measurer, work_dir=tmp_path, trials_per_iter=4)
    assert res.layer == "tiny_conv_ms" and 1 <= res.trials <= 4
    assert res.gflops > 0  # valid against NumPy (time_lib raises on a wrong result: 0.0)
    curve = np.asarray(res.runner_curve)
    assert len(curve) == res.trials and (np.diff(curve) >= 0).all() and curve[-1] > 0
    assert res.runner_gflops == pytest.approx(curve[-1], rel=1e-6)  # its best trial, by its runner
