"""bench.headroom's per-constraint table, against counts by hand."""
import numpy as np
import pytest

from spotlight_jax.bench.headroom import success_table


def test_success_table_counts_rates_and_prompts_by_hand():
    nan = np.nan
    # 3 prompts x 4 seeds; shape applies to prompts 0 and 1 only, text to none
    breakdown = {
        "shape": np.array([1, 0, 0, 0,  1, 1, 0, 1,  nan, nan, nan, nan]),
        "color": np.array([0, 0, 0, 0,  1, 1, 1, 1,  1, 0, 1, 0]),
        "text": np.full(12, nan),
    }
    t = success_table(breakdown, 3)
    assert set(t) == {"shape", "color"}
    assert t["shape"] == {"prompts": 2, "rate": pytest.approx(4 / 8), "any": 1.0, "half": 0.5}
    assert t["color"] == {"prompts": 3, "rate": pytest.approx(6 / 12),
                          "any": pytest.approx(2 / 3), "half": pytest.approx(2 / 3)}
