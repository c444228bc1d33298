"""Flow schedule, SDE/ODE steps with log-probs, and resumable jitted rollouts."""
from spotlight_jax.diffusion import batches, prompt
from spotlight_jax.diffusion.rollout import (
    Sampler,
    SamplerConfig,
    denoise,
    encode_prompt,
    from_image,
    initial_noise,
    step_noise,
    to_image,
    transition,
    velocity,
)
from spotlight_jax.diffusion.schedule import sample_t, shifted_sigmas
from spotlight_jax.diffusion.sde import cps_step, ode_step, sde_step

__all__ = ["Sampler", "SamplerConfig", "batches", "denoise", "encode_prompt", "from_image",
           "initial_noise", "prompt", "step_noise", "to_image", "transition", "velocity",
           "sample_t", "shifted_sigmas", "cps_step", "ode_step", "sde_step"]
