"""RL objectives for flow-matching DiTs: Flow-GRPO (advantages, the clipped per-step loss with
KL) and the forward-process objective (`rl.nft`), their trainers over LoRA or full weights."""
from spotlight_jax.rl.advantages import advantages, decoupled_advantages, group_stats
from spotlight_jax.rl.grpo import GRPOConfig, GRPOTrainer, grpo_loss, select_steps
from spotlight_jax.rl.nft import NFTConfig, NFTTrainer
from spotlight_jax.rl.policy import Trainer
from spotlight_jax.rl.work import ObjectiveWork, UpdateRows

# rl.objective -> its trainer (registry.OBJECTIVES names them; a test checks they match)
TRAINERS = {"nft": NFTTrainer, "flow_grpo": GRPOTrainer}


def trainer_class(cfg):
    """The trainer of an objective's config (:data:`TRAINERS` by the config's objective)."""
    return TRAINERS["nft" if isinstance(cfg, NFTConfig) else "flow_grpo"]


def work_of(cfg, sampler) -> ObjectiveWork:
    """What one update of the objective ``cfg`` on rollouts of ``sampler`` does, without a
    trainer (the cost model, ``--dry_run``, a spot host)."""
    return ObjectiveWork(cfg, sampler, trainer_class(cfg))


__all__ = ["GRPOConfig", "GRPOTrainer", "NFTConfig", "NFTTrainer", "ObjectiveWork", "TRAINERS",
           "Trainer", "UpdateRows", "advantages", "decoupled_advantages", "grpo_loss",
           "group_stats", "select_steps", "trainer_class", "work_of"]
