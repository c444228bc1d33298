"""RunCheckpointer keeps max_to_keep steps and deletes each older step exactly once, however
often the run asks for its steps between asynchronous saves (RunState.save does after each)."""
import logging

import jax.numpy as jnp

from spotlight_jax.io.checkpoints import RunCheckpointer


def test_retention_deletes_each_old_step_once(tmp_path, caplog):
    ck = RunCheckpointer(str(tmp_path), max_to_keep=2)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 7):
            ck.save(step, {"w": jnp.full((4,), float(step))}, {"step": step})
            assert ck.steps(reload=False)[-1] == step
        ck.wait()
    # re-reading the directory while a save was in flight made Orbax forget its deletions:
    # it kept [4, 5, 6] and warned "Unable to find the step 1 for deletion" at every save
    assert ck.steps() == [5, 6]
    assert not [r for r in caplog.records if "for deletion" in r.getMessage()]
    _, tree, meta = ck.restore({"w": jnp.zeros((4,))})
    assert meta["step"] == 6 and float(tree["w"][0]) == 6.0
    ck.close()
