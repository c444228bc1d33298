"""A diffusers base streamed straight onto its shardings: the same parameters as the plain
conversion, each already on its devices in the rule table's layout (nothing gathered on one
device first), and the host memory the load needs, stated per parameter."""
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.config.builders import base_shardings
from spotlight_jax.models.convert import from_diffusers
from spotlight_jax.models.convert.transformer import host_peak_bytes
from spotlight_jax.parallel import MeshConfig, make_mesh

TRANSFORMER = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers" / "transformer"


# per-block parameters with -m e2e (the scanned stack is the harder case: one block at a time)
@pytest.mark.parametrize("scan", [pytest.param(False, marks=pytest.mark.e2e), True],
                         ids=["blocks", "scanned"])
def test_streamed_onto_an_fsdp_mesh_equals_the_plain_conversion(scan):
    folder = TRANSFORMER / "qwen_image"
    plain, cfg = from_diffusers(folder, scan_blocks=scan)
    mesh = make_mesh(jax.devices()[:4], MeshConfig(data=1, fsdp=4, sp=1))
    shardings = base_shardings(cfg, mesh)
    streamed, _ = from_diffusers(folder, scan_blocks=scan, shardings=shardings)
    want = nnx.to_flat_state(nnx.state(plain))
    got = dict(nnx.to_flat_state(nnx.state(streamed)))
    sharded = 0
    for path, var in want:
        a = got[path].get_value()
        np.testing.assert_array_equal(np.asarray(a), np.asarray(var.get_value()))
        assert a.sharding == shardings(path, a.shape), path
        assert {d.id for d in a.sharding.device_set} == {d.id for d in mesh.devices.flat}
        sharded += a.sharding.shard_shape(a.shape) != a.shape
    assert sharded > 0                     # the fsdp axis really splits parameters
    # the host holds one parameter's local shards and one source tensor at a time
    peak = host_peak_bytes(cfg, shardings)
    total = sum(np.asarray(v.get_value()).nbytes for _, v in want)
    assert 0 < peak < total
