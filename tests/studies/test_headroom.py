"""studies.headroom's per-constraint table, against counts by hand."""
import numpy as np
import pytest

from spotlight_jax.studies.headroom import success_table


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


@pytest.mark.e2e
def test_headroom_of_the_shipped_base_counts_every_held_out_prompt(tmp_path):
    # one seed per held-out prompt under the shipped base: every constraint is tabled over the
    # prompts it applies to, and the binding row scores exactly the two-object prompts that ask
    # for two different elongations; a workdir without a checkpoint is refused by name
    import runpy
    from pathlib import Path

    from spotlight_jax import world
    from spotlight_jax.studies.headroom import constraint_headroom

    config = runpy.run_path(str(Path(__file__).parents[2] / "configs" / "tiny.py"))["get_config"]()
    config.mode = "baseline"
    res = constraint_headroom(config, seeds=1)
    kinds = [world.parse(p).kind for p in world.val_prompts()]
    assert res["run"] is None and res["run_binding"] is None
    assert res["base"]["text"]["prompts"] == kinds.count("text")
    assert res["base"]["position"]["prompts"] == kinds.count("position")
    assert res["base"]["color"]["prompts"] == len(kinds) - kinds.count("text")
    elong = {"bar": "wide", "column": "tall"}
    differ = [p for p in world.val_prompts() if world.parse(p).kind in ("two_object", "position")
              and len({elong.get(g.shape, "compact") for g in world.parse(p).groups}) == 2]
    b = res["base_binding"]
    assert b["prompts"] == len(differ) and b["single_prompts"] == kinds.count("single")
    assert sum(b[k] for k in ("both", "swapped", "one", "neither", "missing")) == pytest.approx(1)
    with pytest.raises(FileNotFoundError, match="no checkpoint to restore"):
        constraint_headroom(config, str(tmp_path), seeds=1)
