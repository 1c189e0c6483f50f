"""The small shared package the trainers import as ``from cleanrl_embodied import shared``: the env contract and its
builders, observations and rollout storage, logging and run-keeping (checkpoint files and their checks, random
streams, stop signals, the evaluation loop; docs/internals.md has a module per job). It holds no algorithm:
networks, heads, discounting, advantages, losses, the update and what a checkpoint holds live in each trainer.
Every name a trainer uses is here, as ``shared.<name>``."""

from cleanrl_embodied.shared.atomic_files import atomic_save
from cleanrl_embodied.shared.builders import EnvOptions, build_env, build_policy, load_factory
from cleanrl_embodied.shared.checkpoints import (
    check_env_sizes,
    env_record,
    load_checkpoint,
    load_model_state,
    load_optimizer,
    load_resume_or_eval,
    without_privileged_critic,
)
from cleanrl_embodied.shared.cli import RunArgs, check_args, fail, flag
from cleanrl_embodied.shared.compilation import Compiler, compile_choice
from cleanrl_embodied.shared.device import autocast, pick_device
from cleanrl_embodied.shared.distributed import (
    broadcast_model,
    check_in_sync,
    copy_unsharded_into,
    process_group,
    unsharded,
    unsharded_state,
)
from cleanrl_embodied.shared.envs import BUILTIN_ENV_IDS, check_env_id, env_state_dict, load_env_state_dict, make_env
from cleanrl_embodied.shared.envs.chunks import chunk_space, step_chunk, supports_partial_reset
from cleanrl_embodied.shared.evaluation import Evaluator, evaluate
from cleanrl_embodied.shared.language import VOCAB_SIZE
from cleanrl_embodied.shared.model_state import frozen_fingerprint, inference_copy, model_state
from cleanrl_embodied.shared.non_finite import NonFiniteWatch, SkipGuard
from cleanrl_embodied.shared.observations import (
    PRIVILEGED_KEY,
    flat_dim,
    flatten_obs,
    float_dim,
    float_entries,
    image_spaces,
    obs_for_checkpoint,
    obs_from_checkpoint,
    privileged_dim,
    privileged_entries,
    token_spaces,
)
from cleanrl_embodied.shared.random_streams import rng_state, seed_everything, set_rng_state, stream_seed
from cleanrl_embodied.shared.rollout_stats import RolloutStats
from cleanrl_embodied.shared.run_keeper import RunKeeper
from cleanrl_embodied.shared.run_logger import RunLogger, versions
from cleanrl_embodied.shared.running_stats import RunningMeanStd
from cleanrl_embodied.shared.schedule import note_schedule_change
from cleanrl_embodied.shared.stop_signals import StopFlag
from cleanrl_embodied.shared.storage import micro_batches, rollout_storage
from cleanrl_embodied.shared.trainer_file import describe_trainer

__all__ = [
    "BUILTIN_ENV_IDS",
    "PRIVILEGED_KEY",
    "VOCAB_SIZE",
    "Compiler",
    "EnvOptions",
    "Evaluator",
    "NonFiniteWatch",
    "RolloutStats",
    "RunKeeper",
    "RunningMeanStd",
    "RunArgs",
    "RunLogger",
    "SkipGuard",
    "StopFlag",
    "atomic_save",
    "autocast",
    "broadcast_model",
    "build_env",
    "build_policy",
    "check_args",
    "check_env_id",
    "check_env_sizes",
    "check_in_sync",
    "chunk_space",
    "compile_choice",
    "describe_trainer",
    "copy_unsharded_into",
    "env_record",
    "env_state_dict",
    "evaluate",
    "fail",
    "flag",
    "flat_dim",
    "flatten_obs",
    "float_entries",
    "frozen_fingerprint",
    "image_spaces",
    "inference_copy",
    "load_checkpoint",
    "load_env_state_dict",
    "load_factory",
    "load_model_state",
    "load_optimizer",
    "load_resume_or_eval",
    "make_env",
    "micro_batches",
    "model_state",
    "note_schedule_change",
    "obs_for_checkpoint",
    "obs_from_checkpoint",
    "privileged_dim",
    "privileged_entries",
    "pick_device",
    "process_group",
    "rng_state",
    "rollout_storage",
    "seed_everything",
    "set_rng_state",
    "float_dim",
    "step_chunk",
    "stream_seed",
    "supports_partial_reset",
    "token_spaces",
    "unsharded",
    "unsharded_state",
    "versions",
    "without_privileged_critic",
]
