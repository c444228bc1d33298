"""Logical-axis rule table and mesh construction."""
import jax
import pytest
from jax.sharding import PartitionSpec as P

from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.parallel.sharding import logical_to_spec, validate_rules


def test_rules_map_and_never_reuse_a_mesh_axis():
    assert logical_to_spec(("embed", "mlp")) == P("fsdp", None)
    assert logical_to_spec(("batch", "seq", "embed")) == P(("data", "fsdp"), "sp", None)
    # fsdp already used by batch -> embed replicates
    mesh = make_mesh(jax.devices(), MeshConfig(data=2, fsdp=2, sp=2))
    assert logical_to_spec(("batch", "embed"), mesh=mesh) == P(("data", "fsdp"), None)


def test_duplicate_rules_are_rejected():
    with pytest.raises(ValueError, match="more than once"):
        validate_rules((("embed", "fsdp"), ("embed", None)))


def test_mesh_config_errors_name_the_values():
    with pytest.raises(ValueError, match="not a multiple"):
        MeshConfig(data=-1, sp=3).resolve(8)
    with pytest.raises(ValueError, match="does not match 8 devices"):
        MeshConfig(data=2, fsdp=2, sp=4).resolve(8)
    mesh = make_mesh(jax.devices(), MeshConfig(data=-1, sp=4))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "sp": 4}
