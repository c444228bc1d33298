"""Flow-GRPO: advantages, clipped per-step loss with KL, LoRA, the jitted train step."""
from spotlight_jax.rl.grpo import (
    GRPOConfig,
    GRPOTrainer,
    advantages,
    decoupled_advantages,
    group_stats,
    grpo_loss,
    select_steps,
)

__all__ = ["GRPOConfig", "GRPOTrainer", "advantages", "decoupled_advantages", "grpo_loss",
           "group_stats", "select_steps"]
