"""config.attention_spec: the trainer (and its samplers) lay attention out by
``config.attention`` over the mesh's sp axis; dense without an sp axis or with 'dense'; and
make_trainer hands that layout to the objective's trainer."""
import jax
from helpers import micro_config

from spotlight_jax.config import attention_spec, build_mesh, make_trainer
from spotlight_jax.config import model_config as mcfg
from spotlight_jax.models import AttentionSpec
from spotlight_jax.models.factory import create_model


def test_attention_spec_follows_the_config_and_the_mesh():
    ring = micro_config(1, **{"attention": "ring", "mesh.sp": 2, "mesh.data": -1})
    mesh = build_mesh(ring, jax.devices()[:4])
    spec = attention_spec(ring, mesh)
    assert (spec.strategy, spec.axis, spec.mesh) == ("ring", "sp", mesh)
    assert attention_spec(micro_config(1, **{"mesh.sp": 2, "mesh.data": -1}),
                          mesh) == AttentionSpec()                     # attention='dense'
    flat = micro_config(1, attention="ring")
    assert attention_spec(flat, build_mesh(flat, jax.devices()[:4])) == AttentionSpec()
    graphdef, state = create_model(mcfg(ring))
    assert make_trainer(ring, graphdef, state, mesh=mesh).attn == spec


def test_the_kernel_setting_reaches_the_trainer_and_a_forced_cudnn_on_cpu_is_refused():
    import pytest

    from spotlight_jax.config import ConfigError, RunSpec
    c = micro_config(1, attention_impl="xla")
    assert attention_spec(c, None) == AttentionSpec(impl="xla")
    spec = RunSpec.from_config(micro_config(1, attention_impl="cudnn"))
    with pytest.raises(ConfigError, match=r"^--config.attention_impl='cudnn' cannot run here: "
                                          r"cuDNN flash attention needs NVIDIA GPUs; the devices "
                                          r"are cpu \(cpu\); use 'auto'"):
        spec.check_devices(jax.devices())
    with pytest.raises(ConfigError, match="attention_impl='flash': choose one of"):
        RunSpec.from_config(micro_config(1, attention_impl="flash"))
    RunSpec.from_config(micro_config(1)).check_devices(jax.devices())       # auto: fine
