"""PushCubeRL's observations: the spaces, the flat state vector, sensor dropout, and the observation in each
``obs_mode``.

``PushCubeObs`` holds methods of the env (``env.PushCubeRLVecEnv`` inherits them) that read and write its state
tensors: the observation and action spaces (``_build_spaces``), the flat float32 observation with its noise
(``_observe``), the sensor outages of ``dropout_sensor`` (``_advance_dropout``, ``_drop_readings``), and the
observation in the env's ``obs_mode`` from the flat one and the camera images (``_format_obs``,
``_format_untasked``, ``_instruction_tokens``). The images themselves are drawn in ``render.py``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from cleanrl_embodied.shared.envs.push_cube import franka
from cleanrl_embodied.shared.envs.push_cube.options import (
    OBS_CAMERA_KEYS,
    PROPRIO_DIM,
    SENSOR_MISSING_KEY,
)
from cleanrl_embodied.shared.language import INSTRUCTION_KEY, instruction_space
from cleanrl_embodied.shared.observations import PRIVILEGED_KEY


class PushCubeObs:
    """Methods of the env that build what a policy sees: they read and write its state tensors (see the module
    docstring). Not an env on its own."""

    # ------------------------------------------------------------------ spaces
    def _build_spaces(self) -> None:
        """Set the single and batched observation/action spaces."""
        state_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        image_space = gym.spaces.Box(0, 255, (3, *self.image_size), np.uint8)
        images = {OBS_CAMERA_KEYS[camera]: image_space for camera in self.obs_cameras}
        proprio_space = gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32)
        flag = {}  # sensor dropout: the 0/1 flag, appended to the state vector or an entry of its own
        if self._dropout:
            flag = {SENSOR_MISSING_KEY: gym.spaces.Box(0.0, 1.0, (1,), np.float32)}
            with_flag = lambda box: gym.spaces.Box(  # noqa: E731
                np.append(box.low, np.float32(0.0)), np.append(box.high, np.float32(1.0)), dtype=np.float32
            )
            seen_state_space, proprio_space = with_flag(state_space), with_flag(proprio_space)
        else:
            seen_state_space = state_space  # (the privileged entry is always the true, unflagged state)
        if self.obs_mode == "state":
            self.single_observation_space = seen_state_space
        elif self.obs_mode == "rgb":
            self.single_observation_space = gym.spaces.Dict({**images, **flag})
        elif self.obs_mode == "proprio+rgb":
            self.single_observation_space = gym.spaces.Dict({"state": proprio_space, **images})
        elif self.obs_mode == "state+rgb":
            self.single_observation_space = gym.spaces.Dict({"state": seen_state_space, **images})
        else:
            groups: dict[str, dict[str, gym.spaces.Box]] = {}
            for group, name, size in self.obs_layout:
                groups.setdefault(group, {})[name] = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
            nested = {group: gym.spaces.Dict(boxes) for group, boxes in groups.items()}
            self.single_observation_space = gym.spaces.Dict({**nested, **flag})
        if self.privileged_state:  # (image modes: the observation is a Dict)
            spaces = {**self.single_observation_space.spaces, PRIVILEGED_KEY: state_space}
            self.single_observation_space = gym.spaces.Dict(spaces)
        if self.task_names:  # the instruction joins the observation, which becomes (or stays) a Dict
            spaces = (
                self.single_observation_space.spaces
                if isinstance(self.single_observation_space, gym.spaces.Dict)
                else {"state": self.single_observation_space}
            )
            spaces = {**spaces, INSTRUCTION_KEY: instruction_space(self.instruction_length)}
            self.single_observation_space = gym.spaces.Dict(spaces)
        action_dim = 3 if self.action_mode == "ee_delta_pos" else franka.NUM_JOINTS
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    # ------------------------------------------------------------------ observations
    def _observe(self) -> torch.Tensor:
        """Flat float32 observation [N, obs_dim] of the current state (plus observation noise)."""
        cube_pos = torch.cat((self.cube_xy, self.cube_half_size.unsqueeze(-1)), -1)
        goal_pos = torch.cat((self.goal_xy, torch.zeros_like(self.cube_yaw).unsqueeze(-1)), -1)
        yaw = self.cube_yaw.unsqueeze(-1)
        goal, to_goal = ((goal_pos,), (goal_pos - cube_pos,)) if not self.task_names else ((), ())  # tasks: words
        obs = torch.cat(
            (self.qpos, self.qvel, self.tcp_pos, cube_pos, torch.sin(yaw), torch.cos(yaw), *goal,
             cube_pos - self.tcp_pos, *to_goal, *((self.cube_vel,) if self._sliding else ())),
            -1,
        )  # fmt: skip
        if self._obs_noise:
            noise = torch.randn(obs.shape, generator=self._generator, device=self.device)
            obs = obs + self.obs_noise_std.unsqueeze(-1) * noise
        return obs

    def _advance_dropout(self) -> torch.Tensor:
        """One control step of the sensor outages (``dropout_sensor``), all envs at once, no host sync: an env whose
        sensor works starts an outage with probability ``dropout_rate``, of a uniform length in ``dropout_steps``.
        ``sensor_outage`` [N] (int32) counts down: k > 1 means the current reading is missing (k - 2 more missing
        readings follow), 1 the real reading that ends an outage (none starts there: outages start only from a
        working sensor), 0 a working sensor. Returns the fraction of the episode's steps so far whose reading was
        missing [N] (``info["metrics"]``)."""
        outage = (self.sensor_outage - 1).clamp_min(0)
        draw = torch.rand(self.num_envs, generator=self._generator, device=self.device)
        low, high = self.dropout_steps
        length = torch.randint(low, high + 1, (self.num_envs,), generator=self._generator, device=self.device,
                               dtype=torch.int32)  # fmt: skip
        self.sensor_outage = torch.where((outage == 0) & (draw < self.dropout_rate), length + 1, outage)
        self.sensor_missing_steps = self.sensor_missing_steps + (self.sensor_outage > 1).to(torch.int32)
        return self.sensor_missing_steps / self.elapsed_steps

    def _drop_readings(self, flat_obs: torch.Tensor, images: dict[str, torch.Tensor] | None):
        """What the policy reads with sensor dropout: the flat observation and the images with the missing sensor's
        entries zeroed in the envs whose reading is missing now, and the flag [N, 1] (1.0 where it is missing)."""
        missing = self.sensor_outage > 1
        if self.dropout_sensor == "cube":
            flat_obs = flat_obs.masked_fill(missing.unsqueeze(-1) & self._cube_columns, 0.0)
        else:
            images = {key: image.masked_fill(missing.view(-1, 1, 1, 1), 0) for key, image in images.items()}
        return flat_obs, images, missing.float().unsqueeze(-1)

    def _format_obs(
        self, flat_obs: torch.Tensor, images: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor | TensorDict:
        """The observation in the env's obs_mode from the flat one and the images (rgb modes: {entry: image} of
        every camera): state: as is; dict: nested TensorDict; rgb: TensorDict of the images ({"rgb"} by default);
        proprio+rgb and state+rgb: TensorDict {"state" (the robot's part or all of it), images...}; with tasks each
        also holds the "instruction"; with sensor dropout the missing sensor's entries read zeros where it is out, and
        the flag ``sensor_missing`` joins the state (``_drop_readings``), while "privileged" keeps the true state.
        (The rgb modes compute
        the whole flat observation too, so that observation noise draws the same random numbers in every mode and
        a seed gives the same episodes.)"""
        seen, flag = flat_obs, None
        if self._dropout:
            seen, images, flag = self._drop_readings(flat_obs, images)
        if self.privileged_state:
            obs = self._format_untasked(seen, images, flag)
            obs[PRIVILEGED_KEY] = flat_obs
            if self.task_names:
                obs[INSTRUCTION_KEY] = self._instruction_tokens()
            return obs
        if self.task_names:
            obs = self._format_untasked(seen, images, flag)
            if not isinstance(obs, TensorDict):
                obs = TensorDict({"state": obs}, batch_size=[self.num_envs], device=self.device)
            obs[INSTRUCTION_KEY] = self._instruction_tokens()
            return obs
        return self._format_untasked(seen, images, flag)

    def _instruction_tokens(self) -> TensorDict:
        """The instruction tokens of every env's episode: its task's, or its task's held-out phrase's."""
        row = self.task * self._phrases_per_task + self.phrase if self._heldout else self.task
        return self._task_tokens[row]

    def _format_untasked(
        self, flat_obs: torch.Tensor, images: dict[str, torch.Tensor] | None, flag: torch.Tensor | None = None
    ) -> torch.Tensor | TensorDict:
        """``_format_obs`` without the privileged and instruction entries; ``flag`` (sensor dropout, [N, 1]) is
        appended to the state vector, or is the entry ``sensor_missing`` where there is none (dict and rgb)."""
        if self.obs_mode == "state":
            return flat_obs if flag is None else torch.cat((flat_obs, flag), -1)
        if self._images:
            state = {"rgb": {}, "proprio+rgb": {"state": flat_obs[:, :PROPRIO_DIM]}, "state+rgb": {"state": flat_obs}}
            state = state[self.obs_mode]
            if flag is not None:
                state = {"state": torch.cat((state["state"], flag), -1)} if state else {SENSOR_MISSING_KEY: flag}
            return TensorDict({**state, **images}, batch_size=[self.num_envs], device=self.device)
        pieces = flat_obs.split([size for _, _, size in self.obs_layout], dim=-1)
        nested: dict[str, dict[str, torch.Tensor]] = {}
        for (group, name, _), piece in zip(self.obs_layout, pieces):
            nested.setdefault(group, {})[name] = piece
        if flag is not None:
            nested[SENSOR_MISSING_KEY] = flag
        return TensorDict(nested, batch_size=[self.num_envs], device=self.device)
