"""RL objectives for flow-matching DiTs: Flow-GRPO (advantages, the clipped per-step loss with
KL) and the forward-process objective (`rl.nft`), their trainers over LoRA or full weights."""
from spotlight_jax.rl.advantages import advantages, decoupled_advantages, group_stats
from spotlight_jax.rl.grpo import GRPOConfig, GRPOTrainer, grpo_loss, select_steps
from spotlight_jax.rl.nft import NFTConfig, NFTTrainer
from spotlight_jax.rl.policy import Trainer, UpdateRows

# rl.objective -> its trainer (registry.OBJECTIVES names them; a test checks they match)
TRAINERS = {"nft": NFTTrainer, "flow_grpo": GRPOTrainer}


def trainer_class(cfg):
    """The trainer of an objective's config (:data:`TRAINERS` by the config's objective)."""
    return TRAINERS["nft" if isinstance(cfg, NFTConfig) else "flow_grpo"]


__all__ = ["GRPOConfig", "GRPOTrainer", "NFTConfig", "NFTTrainer", "TRAINERS", "Trainer",
           "UpdateRows", "trainer_class", "advantages", "decoupled_advantages", "grpo_loss",
           "group_stats",
           "select_steps"]
