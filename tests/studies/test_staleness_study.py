"""studies.staleness_study under the forward-process objective: the policies compared are the
lagging sampling policies θ_old, scored with the ODE rollout (a seed fixes the image)."""
import json

import numpy as np
import pytest

from spotlight_jax import programs
from spotlight_jax.studies import staleness_study


@pytest.mark.e2e   # four tiny-config iterations and ~150 scored rollouts
def test_nft_study_compares_sampling_policies_with_ode_scoring(tmp_path):
    out = staleness_study.run_study(programs.TINY_CONFIG, iterations=4, at=[4], num_prompts=2,
                                    num_seeds=12, objective="nft", out=str(tmp_path))
    assert out["objective"] == "nft" and out["lr"] == pytest.approx(1e-3)
    assert sorted(out["staleness"]) == ["4,1", "4,2", "4,4"]
    assert list(out["scorers"]) == ["ODE, 5 steps"]
    for s in out["staleness"].values():
        tau = s["tau"]
        assert tau is None or -1.0 <= tau["lo"] <= tau["mean"] <= tau["hi"] <= 1.0
    saved = json.loads((tmp_path / "staleness.json").read_text())
    assert saved["objective"] == "nft" and np.isfinite(saved["train_s"])
