"""The small shared package the trainers import: env contract, TensorDict helpers, logging."""

from cleanrl_embodied.shared.checkpoints import check_dims
from cleanrl_embodied.shared.envs import BUILTIN_ENV_IDS, check_env_id, env_state_dict, load_env_state_dict, make_env
from cleanrl_embodied.shared.logging import RolloutStats, RunLogger, atomic_save, versions
from cleanrl_embodied.shared.tensordict_helpers import flat_dim, flatten_obs, rollout_storage

__all__ = [
    "BUILTIN_ENV_IDS",
    "RolloutStats",
    "RunLogger",
    "atomic_save",
    "check_dims",
    "check_env_id",
    "env_state_dict",
    "flat_dim",
    "flatten_obs",
    "load_env_state_dict",
    "make_env",
    "rollout_storage",
    "versions",
]
