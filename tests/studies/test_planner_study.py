"""``studies.planner`` as the program a reader runs (its simulations are tested with the planner,
tests/explore/test_planner.py)."""
import subprocess
import sys

from spotlight_jax.programs import REPO


def test_planner_study_runs_as_a_program():
    proc = subprocess.run([sys.executable, "-m", "spotlight_jax.studies.planner", "--scenarios=A",
                           "--num_seeds=2", "--iterations=3"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for alg in ("none", "uniform", "ucb", "thompson", "oracle"):
        assert f"\n{alg} " in proc.stdout, proc.stdout
    bad = subprocess.run([sys.executable, "-m", "spotlight_jax.studies.planner", "--scenarios=Z"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--scenarios: unknown ['Z']" in bad.stderr
