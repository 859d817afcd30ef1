"""Every example stands alone: copied into an empty directory (with the example it builds
on, if any) it runs, and its ``--help`` lists each flag with the docstring of its ``Args``
field. Examples reach the run plumbing through ``timerl.run``, never through ``sys.path``."""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

import timerl as trl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The examples that import another example beside them (a copy needs those files too).
# Programs that several examples share live in the library (``timerl.agents.ppo``,
# ``timerl.agents.tiramisu``), so every example imports only ``timerl``. The rule stays so
# that a new cross-example import is caught.
BUILDS_ON: dict[str, set[str]] = {}
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.py"))


def _sibling_imports(path: Path) -> set[str]:
    """The examples (files beside ``path``) that ``path`` imports."""
    tree = ast.parse(path.read_text())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods & set(NAMES)


def test_examples_list_is_known() -> None:
    assert {"ppo", "ppo_looptune", "reinforce", "dqn_looptune", "release"} <= set(NAMES)
    assert not (EXAMPLES / "_common.py").exists()


def _needed(name: str) -> list[str]:
    """``name`` and the examples it builds on, transitively."""
    out, todo = [name], [name]
    while todo:
        for dep in sorted(BUILDS_ON.get(todo.pop(), ())):
            if dep not in out:
                out.append(dep)
                todo.append(dep)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_example_imports_only_timerl_and_declared_examples(name: str) -> None:
    src = (EXAMPLES / f"{name}.py").read_text()
    assert "sys.path" not in src, f"{name}.py edits sys.path; shared run plumbing is in timerl.run"
    assert _sibling_imports(EXAMPLES / f"{name}.py") == BUILDS_ON.get(name, set())


@pytest.mark.parametrize("name", NAMES)
def test_copied_example_help_shows_every_field_doc(name: str, tmp_path: Path) -> None:
    for n in _needed(name):
        shutil.copy(EXAMPLES / f"{n}.py", tmp_path / f"{n}.py")
    sys.path.insert(0, str(EXAMPLES))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))
    docs = trl.run.field_docs(mod.Args)
    names = [f.name for f in fields(mod.Args)]
    assert set(names) <= set(docs), f"fields without a docstring: {sorted(set(names) - set(docs))}"
    # the copy runs with examples/ off the path (timerl as installed, or this checkout's root)
    path = [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != EXAMPLES
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run(
        [sys.executable, f"{name}.py", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    flat = " ".join(out.split())
    for n in names:
        assert f"--{n.replace('_', '-')}" in out
        assert " ".join(docs[n].split()[:4]) in flat, n


@pytest.mark.parametrize(
    ("name", "argv", "said"),
    [
        ("ppo", ["--num-seeds", "2", "--bc-coef", "0.1"], "give --bc-coef 0"),
        ("ppo", ["--num-envs", "0"], "--num-envs must be at least 1"),
        ("ppo_looptune", ["--iterations", "0"], "--iterations must be at least 1"),
        ("reinforce", ["--n", "-1"], "--n must be 0"),
        ("reinforce", ["--num-seeds", "0"], "--num-seeds must be at least 1"),
    ],
)
def test_a_flag_that_cannot_make_a_program_is_a_usage_error(
    name: str, argv: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag that cannot make the example's program stops at the command line with
    argparse's usage error naming it (exit status 2), not a traceback after building."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as stop:
        mod.parse_args()
    assert stop.value.code == 2
    assert said in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    assert isinstance(mod.parse_args(), mod.Args)  # the defaults pass
