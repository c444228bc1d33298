"""Elastic layer: device pool, SP regrouping, executable cache, state moves.

``DevicePool`` knows each device's node and role and which are alive (it applies the
join/notice/loss events that ``spotlight_jax.emulation.traces`` replays); ``groups`` re-forms SP
groups inside nodes; ``exec_cache`` holds programs compiled ahead of time for every group a
node can form; ``state_move`` rebuilds state on a new mesh from live devices only (re-wrap or
device-to-device copy, never from storage).
"""
from spotlight_jax.elastic.exec_cache import (
    CacheMiss,
    ExecutableCache,
    count_backend_compiles,
    enable_persistent_cache,
    reachable_groups,
    reachable_survivor_sets,
)
from spotlight_jax.elastic.groups import (
    GroupConfig,
    SPGroup,
    choose_strategy,
    form_groups,
    form_node_groups,
)
from spotlight_jax.elastic.pool import ROLES, DevicePool, PoolConfig, PoolEvent
from spotlight_jax.elastic.state_move import (
    MoveReport,
    ShardSource,
    ShardViews,
    StateLostError,
    move_tree,
    shard_views,
)

__all__ = [
    "CacheMiss", "ExecutableCache", "count_backend_compiles", "enable_persistent_cache",
    "reachable_groups", "reachable_survivor_sets",
    "GroupConfig", "SPGroup", "choose_strategy", "form_groups", "form_node_groups",
    "ROLES", "DevicePool", "PoolConfig", "PoolEvent",
    "MoveReport", "ShardSource", "ShardViews", "StateLostError", "move_tree", "shard_views",
]
