"""Every entry point has the same command line: absl flags, defined only when it runs."""
import ast
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from absl import app, flags  # noqa: F401 - app defines absl's own flags (--pdb, ...)

import spotlight_jax
import spotlight_jax.bench
import spotlight_jax.cluster_programs
import spotlight_jax.studies

PACKAGE = Path(spotlight_jax.__file__).parent
ROOT = PACKAGE.parent
# every benchmark, study and cluster program: "<package>.<module>"
PROGRAMS = sorted(f"{pkg.__name__.split('.')[-1]}.{m.name}"
                  for pkg in (spotlight_jax.bench, spotlight_jax.studies,
                              spotlight_jax.cluster_programs)
                  for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))
# Flags app.run defines itself (help) or FlagValues handles (flagfile, undefok).
ABSL_RESERVED = {"help", "helpshort", "helpfull", "helpxml", "flagfile", "undefok"}


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def _main_block(tree: ast.Module):
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
            return node
    return None


def test_no_argparse_in_the_package():
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if "argparse" in _imports(ast.parse(p.read_text())))
    assert not users, users


def test_every_program_runs_through_absl_app():
    """A module with an ``if __name__ == "__main__":`` block calls ``app.run`` in it."""
    missing = []
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        block = _main_block(ast.parse(path.read_text()))
        if block is None:
            continue
        calls = [n for n in ast.walk(block) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "run"
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "app"]
        if not calls:
            missing.append(rel)
    assert not missing, missing


@pytest.mark.parametrize("name", PROGRAMS)
def test_bench_uses_absl_flags_defined_only_when_run(name):
    mod = importlib.import_module(f"spotlight_jax.{name}")
    assert hasattr(mod, "main") and hasattr(mod, "define_flags"), name
    tree = ast.parse(Path(mod.__file__).read_text())
    assert "absl" in _imports(tree) and "argparse" not in _imports(tree)
    block = _main_block(tree)
    assert block is not None, f"{name} has no __main__ block"
    src = ast.unparse(block)
    assert "define_flags()" in src and "app.run(main)" in src, src
    # importing the benchmark defined no global flag (benchmarks share names like --out)
    assert not flags.FLAGS.flags_by_module_dict().get(mod.__name__)
    fv = flags.FlagValues()
    mod.define_flags(fv)
    absl_own = {f.name for m, fl in flags.FLAGS.flags_by_module_dict().items()
                if m.startswith("absl") for f in fl} | ABSL_RESERVED
    assert not set(fv) & absl_own, set(fv) & absl_own
    try:
        assert fv(["prog"]) == ["prog"]                               # the defaults parse
    except flags.IllegalFlagValueError as e:                          # or a flag is required
        assert "must have a value other than None" in str(e), e


def test_emulate_devices_sets_the_count_before_jax_runs():
    """Called first in a fresh process (no JAX_PLATFORMS / XLA_FLAGS set): n CPU devices, and the
    settings exported for child processes."""
    code = ("import os, jax\n"
            "from spotlight_jax import programs\n"
            "programs.emulate_devices(3)\n"
            "print(jax.device_count(), jax.default_backend(), os.environ['JAX_PLATFORMS'],\n"
            "      os.environ['XLA_FLAGS'])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", "cpu", "cpu", "--xla_force_host_platform_device_count=3"]


def test_reconfig_times_stand_in_trees_without_a_model():
    """``bench.reconfig --stand_in``: the state move of a tree with no model behind it (where the
    cost model's regroup constants come from); warm regroups compile nothing."""
    proc = subprocess.run([sys.executable, "-m", "spotlight_jax.bench.reconfig", "--configs=",
                           "--stand_in=1e6", "--repeats=1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.lstrip().startswith("1.0M")]
    assert [r[2] for r in rows] == ["lose", "rejoin"], proc.stdout
    for r in rows:
        assert r[-1].split("/")[0] == "0", r    # warm: 0 compiles on the critical path
