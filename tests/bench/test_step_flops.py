"""``bench.step_flops`` on the tiny config: the order the step's forms must have, and the
factored LoRA step saving at least the image stream's weight gradients (counted by hand from
the adapted kernels' shapes) over the merged one."""
import jax
import pytest
from flax import nnx
from helpers import TINY

from spotlight_jax import config as conf
from spotlight_jax.bench import step_flops
from spotlight_jax.models.factory import abstract_model
from spotlight_jax.rl import lora as lora_lib


@pytest.mark.e2e       # four compiles (~13 s): with the longer checks
def test_step_flops_orders_the_forms_and_counts_the_weight_gradients_saved():
    batch, latent, rank = 1, 8, 4
    r = step_flops.step_flops(TINY, depth=1, latent=latent, batch=batch, rank=rank)
    assert r["lora_factored_flops"] < r["lora_merged_flops"] < r["full_flops"]
    assert 1.0 < r["lora_factored_over_forward"] < r["full_over_forward"] < 4.0
    assert "factored LoRA saves" in step_flops.table(r)
    # The merged step forms x^T dy (2 T din dout) for each adapted image-stream kernel (the
    # velocity depends on all of them); the factored one instead spends rank-sized products
    # (at most 6 T r (din + dout): x a, its use, and their gradients).
    cfg = conf.model_config(conf.load_config(TINY, {"model.depth": 1, "model.image_size": latent,
                                                    "model.scan_blocks": False}))
    _, state = abstract_model(cfg)
    tokens = batch * (latent // cfg.patch_size) ** 2
    saved = 0
    for path, w in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(state)):
        if lora_lib.is_target(path) and "img" in jax.tree_util.keystr(path):
            din, dout = w.shape
            saved += 2 * tokens * din * dout - 6 * tokens * rank * (din + dout)
    assert saved > 0
    assert r["lora_merged_flops"] - r["lora_factored_flops"] >= saved
