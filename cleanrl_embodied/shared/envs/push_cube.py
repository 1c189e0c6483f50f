"""PushCubeRL: a kinematic Franka Panda pushes a cube to a goal on a table, batched in torch.

The task follows ManiSkill's PushCube-v1 (same robot, rest pose, base position, control mode and
dense reward, shifted down by 1), with the physics replaced by a few batched tensor ops so that
thousands of envs step on a CPU:

* Robot: 7 joint-position deltas per control step (0.1 rad at action 1, like ``pd_joint_delta_pos``),
  tracked exactly (no dynamics), clipped to the joint limits. Control runs at 20 Hz.
* The TCP is a sphere of radius ``TCP_RADIUS``. The table top (z = 0), and the cube's top face when
  the TCP comes down onto it, support it: a joint step that would sink it is corrected so that the
  TCP slides along the surface (see ``_move_arm``). The other arm links collide with nothing (they
  may pass through the table and the cube).
* Cube: a square of side ``2 * cube_half_size`` sliding on the table (it never tips or lifts).
  Pushing is quasi-static: when the TCP sphere overlaps the cube's height and penetrates its square
  in xy, the cube is moved out along the contact normal by exactly the penetration, and turned by the
  torque of that push about its centre (scaled by ``push_friction``). The TCP path of a control
  step is split into ``contact_substeps`` straight sub-steps, each resolving contact, so the arm
  cannot tunnel through the cube at full speed: a sub-step only tunnels when longer than the cube
  plus the sphere (0.06 m), i.e. 0.48 m per control step with 8 sub-steps, while the fastest TCP
  motion near the table is about 0.21 m per step.

This module holds the raw task only: episode statistics are added by a wrapper. All state lives in
torch tensors on ``device``; ``step`` has no Python loop over envs and never syncs with the host.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from cleanrl_embodied.shared.envs import franka

CONTROL_DT = 0.05  # seconds per control step (20 Hz)
JOINT_DELTA_SCALE = 0.1  # radians per control step at action magnitude 1
TCP_RADIUS = 0.01  # metres
REST_QPOS_NOISE = 0.02  # half-width of the uniform noise added to the rest pose at reset (radians)
PUSH_POINT_MARGIN = 0.005  # the reward's push point lies this far behind the TCP-cube contact
REACH_THRESHOLD = 0.01  # TCP within this distance of the push point counts as "reached"
ABOVE_CUBE_TOLERANCE = 1e-5  # slack when deciding that the TCP comes down onto the cube's top face

# Layout of the flat (state mode) observation; the dict mode holds the same pieces.
OBS_LAYOUT = (
    ("robot", "qpos", 7),
    ("robot", "qvel", 7),
    ("robot", "tcp_pos", 3),
    ("object", "cube_pos", 3),
    ("object", "cube_yaw_sincos", 2),
    ("goal", "goal_pos", 3),
    ("object", "tcp_to_cube", 3),
    ("object", "cube_to_goal", 3),
)
OBS_DIM = sum(size for _, _, size in OBS_LAYOUT)

# Per-env state tensors; state_dict() saves exactly these (plus the generator and the group size).
STATE_KEYS = (
    "qpos", "qvel", "tcp_pos", "cube_xy", "cube_yaw", "goal_xy",
    "cube_half_size", "push_friction", "elapsed_steps",
)  # fmt: skip

# Top-down render: the world rectangle shown and the colours used (RGB in [0, 1]).
RENDER_X_RANGE = (-0.75, 0.45)
RENDER_Y_RANGE = (-0.6, 0.6)
TABLE_COLOR = (0.82, 0.74, 0.62)
GOAL_REGION_COLOR = (0.55, 0.80, 0.50)
GOAL_CENTRE_COLOR = (0.85, 0.15, 0.15)
CUBE_COLOR = (0.20, 0.40, 0.90)
BASE_COLOR = (0.25, 0.25, 0.28)
LINK_HALF_WIDTH = 0.012
LINK_ALPHA = 0.5  # links are see-through so the cube under the hand stays visible


class PushCubeRLVecEnv(gym.vector.VectorEnv):
    """Batched PushCube task on torch tensors (Gymnasium vector API, SAME_STEP autoreset).

    Observation (state mode, float32 [N, 31]): qpos (7), qvel (7), tcp_pos (3), cube_pos (3),
    sin/cos of the cube yaw (2), goal_pos (3), tcp->cube (3), cube->goal (3). ``obs_mode="dict"``
    returns the same values as a nested TensorDict {"robot", "object", "goal"} of batch size [N].

    Reward: ManiSkill PushCube-v1's normalized dense reward, shifted down by 1. With the push point a
    little behind the cube on the side away from the goal (at cube-centre height),
    ``reach = 1 - tanh(5 d_push)``, ``place = 1 - tanh(5 d_goal)``, reward
    ``(reach + place * [d_push < 0.01]) / 3 - 1`` (in [-1, -1/3]), and 0 on success. Success: the cube
    centre lies within ``goal_radius`` of the goal in xy. The shift matters because success ends the
    episode: with ManiSkill's positive rewards (1 on success) hovering at the push point forever is
    worth more than finishing once termination is not bootstrapped, and PPO (gamma 0.8) learns to
    hover (0 % success); with rewards <= 0 finishing is best, and PPO solves the task within ~0.5 M
    env steps.

    World frame: table top at z = 0, robot base at ``base_pos`` (ManiSkill's (-0.615, 0, 0)). The
    rest-pose TCP sits at (0, 0, 0.170), right above the centre of the cube spawn square, so the
    push point (about 0.15 m below and at most 0.17 m aside) is a few control steps away.
    """

    metadata = {
        "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP,
        "render_modes": ["rgb_array"],
        "render_fps": 20,
    }

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        max_episode_steps: int = 50,
        obs_mode: str = "state",
        terminate_on_success: bool = True,
        goal_direction: float = 0.0,
        goal_distance: float = 0.2,
        goal_radius: float = 0.1,
        cube_half_size: float = 0.02,
        cube_xy_range: float = 0.1,
        cube_yaw_range: float = 0.0,
        contact_substeps: int = 8,
        cube_half_size_range: tuple[float, float] | None = None,
        push_friction: float = 1.0,
        push_friction_range: tuple[float, float] | None = None,
        obs_noise_std: float = 0.0,
        action_noise_std: float = 0.0,
        base_pos: tuple[float, float, float] = franka.DEFAULT_BASE_POS,
        render_mode: str | None = "rgb_array",
    ):
        """Build the batched task.

        Args:
            num_envs: number of parallel envs N.
            device: torch device holding all state.
            seed: seed of the env's own generator (None: a random seed).
            max_episode_steps: control steps before an episode is truncated.
            obs_mode: "state" (flat float32 [N, 31]) or "dict" (nested TensorDict).
            terminate_on_success: end the episode (terminated) as soon as the cube reaches the goal;
                when False every episode lasts max_episode_steps (ManiSkill's ignore_terminations).
            goal_direction: direction from the cube's start to the goal, radians (0 = +x).
            goal_distance: distance from the cube's start to the goal, metres.
            goal_radius: success when the cube centre is closer than this to the goal (xy).
            cube_half_size: half the cube's side, metres (when cube_half_size_range is None).
            cube_xy_range: the cube starts uniformly in [-range, range]^2.
            cube_yaw_range: the cube's start yaw is uniform in [-range, range] radians.
            contact_substeps: straight sub-steps of the TCP path per control step for contact.
            cube_half_size_range: (low, high) to resample the half size per env at every reset.
            push_friction: how strongly an off-centre push turns the cube (0: never turns).
            push_friction_range: (low, high) to resample push_friction per env at every reset.
            obs_noise_std: std of Gaussian noise added to every observation entry.
            action_noise_std: std of Gaussian noise added to the clipped action (then clipped again).
            base_pos: world position of the robot base.
            render_mode: only "rgb_array" (kept for Gymnasium's make_vec).
        """
        _check_args(num_envs, max_episode_steps, obs_mode, contact_substeps, goal_radius,
                    cube_half_size, cube_half_size_range, push_friction_range, render_mode)  # fmt: skip
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.render_mode = render_mode
        self.obs_mode = obs_mode
        self.max_episode_steps = max_episode_steps
        self.terminate_on_success = terminate_on_success
        self.goal_distance = goal_distance
        self.goal_radius = goal_radius
        self.cube_xy_range = cube_xy_range
        self.cube_yaw_range = cube_yaw_range
        self.contact_substeps = contact_substeps
        self._substep_fractions = [k / contact_substeps for k in range(1, contact_substeps + 1)]
        self.cube_half_size_range = cube_half_size_range or (cube_half_size, cube_half_size)
        self.push_friction_range = push_friction_range or (push_friction, push_friction)
        self.obs_noise_std = obs_noise_std
        self.action_noise_std = action_noise_std
        self.base_pos = tuple(float(v) for v in base_pos)

        self._build_spaces()
        self.joint_lower, self.joint_upper = franka.joint_limits(self.device)
        self.rest_qpos = franka.rest_qpos(self.device)
        self.goal_dir_xy = torch.tensor(
            [math.cos(goal_direction), math.sin(goal_direction)], dtype=torch.float32, device=self.device
        )
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._group_size = 1
        for key, value in self._sample_start_state().items():
            setattr(self, key, value)

    # ------------------------------------------------------------------ spaces
    def _build_spaces(self) -> None:
        """Set the single and batched observation/action spaces."""
        if self.obs_mode == "state":
            self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        else:
            groups: dict[str, dict[str, gym.spaces.Box]] = {}
            for group, name, size in OBS_LAYOUT:
                groups.setdefault(group, {})[name] = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
            nested = {group: gym.spaces.Dict(boxes) for group, boxes in groups.items()}
            self.single_observation_space = gym.spaces.Dict(nested)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (franka.NUM_JOINTS,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    # ------------------------------------------------------------------ reset
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every env. ``seed`` reseeds the env's generator; ``options={"group_size": G}`` makes
        consecutive groups of G envs start identically (also at their later autoresets)."""
        if seed is not None:
            self._generator.manual_seed(seed)
        self._group_size = self._parse_group_size(options)
        for key, value in self._sample_start_state().items():
            setattr(self, key, value)
        return self._format_obs(self._observe()), {}

    def _parse_group_size(self, options: dict | None) -> int:
        """Group size from reset options (1 when absent), checked against num_envs."""
        group_size = (options or {}).get("group_size", 1)
        if not isinstance(group_size, (int, np.integer)) or group_size < 1 or self.num_envs % group_size:
            raise ValueError(
                f"PushCubeRL: group_size must be a positive integer dividing num_envs={self.num_envs}, "
                f"got {group_size!r}"
            )
        return int(group_size)

    def _uniform(self, num: int, low, high, *shape: int) -> torch.Tensor:
        """Uniform samples in [low, high) of shape [num, *shape] from the env's generator."""
        u = torch.rand((num, *shape), generator=self._generator, device=self.device)
        return low + (high - low) * u

    def _sample_start_state(self) -> dict[str, torch.Tensor]:
        """Fresh initial state for all N envs (one sample per group, repeated over its envs)."""
        num_groups = self.num_envs // self._group_size
        noise = self._uniform(num_groups, -REST_QPOS_NOISE, REST_QPOS_NOISE, franka.NUM_JOINTS)
        qpos = self.rest_qpos + noise
        cube_xy = self._uniform(num_groups, -self.cube_xy_range, self.cube_xy_range, 2)
        cube_yaw = self._uniform(num_groups, -self.cube_yaw_range, self.cube_yaw_range)
        cube_half_size = self._uniform(num_groups, *self.cube_half_size_range)
        push_friction = self._uniform(num_groups, *self.push_friction_range)
        if self._group_size > 1:
            qpos, cube_xy, cube_yaw, cube_half_size, push_friction = (
                t.repeat_interleave(self._group_size, dim=0)
                for t in (qpos, cube_xy, cube_yaw, cube_half_size, push_friction)
            )
        qpos = self._clip_to_limits(qpos)
        return {
            "qpos": qpos,
            "qvel": torch.zeros_like(qpos),
            "tcp_pos": franka.tcp_position(qpos, self.base_pos),
            "cube_xy": cube_xy,
            "cube_yaw": cube_yaw,
            "goal_xy": cube_xy + self.goal_distance * self.goal_dir_xy,
            "cube_half_size": cube_half_size,
            "push_friction": push_friction,
            "elapsed_steps": torch.zeros(self.num_envs, dtype=torch.int32, device=self.device),
        }

    def _reset_finished(self, done: torch.Tensor) -> None:
        """Replace the state of envs where ``done`` with a fresh start (no host sync)."""
        start = self._sample_start_state()
        done_col = done.unsqueeze(-1)
        for key, fresh in start.items():
            current = getattr(self, key)
            mask = done_col if current.dim() == 2 else done
            setattr(self, key, torch.where(mask, fresh, current))

    def randomize_parameters(self) -> None:
        """Resample the randomized physical parameters (cube size, push friction) of every env now,
        mid-episode (an interval randomization event; groups keep sharing their values)."""
        num_groups = self.num_envs // self._group_size
        half = self._uniform(num_groups, *self.cube_half_size_range)
        friction = self._uniform(num_groups, *self.push_friction_range)
        self.cube_half_size = half.repeat_interleave(self._group_size, dim=0)
        self.push_friction = friction.repeat_interleave(self._group_size, dim=0)

    # ------------------------------------------------------------------ step
    def step(self, actions: torch.Tensor):
        """Apply joint-delta actions [N, 7]; finished envs are reset in the same call (SAME_STEP)."""
        actions = torch.as_tensor(actions, dtype=torch.float32, device=self.device).clamp(-1.0, 1.0)
        if self.action_noise_std > 0:
            noise = torch.randn(actions.shape, generator=self._generator, device=self.device)
            actions = (actions + self.action_noise_std * noise).clamp(-1.0, 1.0)

        tcp_before = self.tcp_pos
        self._move_arm(actions)
        tcp_prev = tcp_before
        for fraction in self._substep_fractions:
            tcp_substep = torch.lerp(tcp_before, self.tcp_pos, fraction)
            self._resolve_contact(tcp_prev, tcp_substep)
            tcp_prev = tcp_substep
        self.elapsed_steps = self.elapsed_steps + 1

        distance_to_goal = torch.linalg.vector_norm(self.cube_xy - self.goal_xy, dim=-1)
        success = distance_to_goal < self.goal_radius
        reward = self._reward(distance_to_goal, success)
        terminated = success.clone() if self.terminate_on_success else torch.zeros_like(success)
        truncated = self.elapsed_steps >= self.max_episode_steps
        done = terminated | truncated

        final_obs = self._observe()
        self._reset_finished(done)
        obs = self._observe()
        info = {
            "final_obs": self._format_obs(final_obs),
            "_final_obs": done,
            "success": success,
            "metrics": {"distance_to_goal": distance_to_goal},
        }
        return self._format_obs(obs), reward, terminated, truncated, info

    def _move_arm(self, actions: torch.Tensor) -> None:
        """Apply the joint step; a TCP that would sink below its support slides along it instead.

        The support is the table, or the cube's top face when coming down onto it. A commanded
        configuration that puts the TCP below the support is corrected by one Newton step on the
        TCP height (the smallest joint change that lifts it back, from the height's gradient), so
        the vertical part of the motion is removed and the horizontal part kept (a frictionless
        surface). The small residual of that linear step is clamped on the TCP position.
        """
        qpos_before = self.qpos
        qpos_target = self._clip_to_limits(qpos_before + JOINT_DELTA_SCALE * actions)
        tcp_target, jacobian = franka.tcp_position_and_jacobian(qpos_target, self.base_pos)
        min_z = self._support_height(self.tcp_pos, tcp_target) + TCP_RADIUS
        shortfall = (min_z - tcp_target[:, 2]).clamp_min(0.0)
        height_gradient = jacobian[:, 2, :]
        gradient_sq = (height_gradient * height_gradient).sum(-1).clamp_min(1e-6)
        lift = height_gradient * (shortfall / gradient_sq).unsqueeze(-1)
        lift = lift.clamp(-JOINT_DELTA_SCALE, JOINT_DELTA_SCALE)
        self.qpos = self._clip_to_limits(qpos_target + lift)
        tcp = franka.tcp_position(self.qpos, self.base_pos)
        tcp[:, 2] = torch.maximum(tcp[:, 2], min_z)
        self.tcp_pos = tcp
        self.qvel = (self.qpos - qpos_before) / CONTROL_DT

    def _clip_to_limits(self, qpos: torch.Tensor) -> torch.Tensor:
        """Joint positions clipped to the Panda's limits."""
        return torch.minimum(torch.maximum(qpos, self.joint_lower), self.joint_upper)

    def _support_height(self, tcp_before: torch.Tensor, tcp_target: torch.Tensor) -> torch.Tensor:
        """Height of the surface under the TCP's target [N]: the cube's top when the TCP comes from
        above the cube and ends over its square, else the table (0)."""
        cos_yaw, sin_yaw = torch.cos(self.cube_yaw), torch.sin(self.cube_yaw)
        u, v = self._to_cube_frame(tcp_target[:, 0], tcp_target[:, 1], cos_yaw, sin_yaw)
        half = self.cube_half_size
        over_cube = (u.abs() <= half) & (v.abs() <= half)
        came_from_above = tcp_before[:, 2] - TCP_RADIUS >= 2 * half - ABOVE_CUBE_TOLERANCE
        return torch.where(over_cube & came_from_above, 2 * half, torch.zeros_like(half))

    def _to_cube_frame(self, x: torch.Tensor, y: torch.Tensor, cos_yaw: torch.Tensor, sin_yaw: torch.Tensor):
        """World xy points [N] expressed in each cube's frame (origin at its centre, axes along its faces)."""
        dx, dy = x - self.cube_xy[:, 0], y - self.cube_xy[:, 1]
        return cos_yaw * dx + sin_yaw * dy, cos_yaw * dy - sin_yaw * dx

    def _resolve_contact(self, tcp_prev: torch.Tensor, tcp: torch.Tensor) -> None:
        """Push each cube out of the TCP sphere that moved from ``tcp_prev`` to ``tcp`` [N, 3].

        Works in the cube frame (2-D). If the TCP centre is outside the square, the contact point is
        the square's closest point and the normal points from it to the TCP. If the centre got
        inside (a fast approach), the contact is on the face it entered through, taken from where the
        previous sub-step point lay, and the normal is that face's; so even a sub-step that carries
        the centre past the cube's middle pushes the cube forward instead of tunnelling (only a
        sub-step longer than the cube plus the sphere could). The cube moves by
        ``-normal * penetration`` and turns by
        ``push_friction * (contact x displacement) / (rho^2 + |contact|^2)``, with rho^2 = side^2 / 6
        (the square's radius of gyration), so a push through the centre never turns it.
        """
        half = self.cube_half_size
        cos_yaw, sin_yaw = torch.cos(self.cube_yaw), torch.sin(self.cube_yaw)
        u, v = self._to_cube_frame(tcp[:, 0], tcp[:, 1], cos_yaw, sin_yaw)
        u_prev, v_prev = self._to_cube_frame(tcp_prev[:, 0], tcp_prev[:, 1], cos_yaw, sin_yaw)

        # Centre outside the square: closest point and outward normal.
        closest_u, closest_v = torch.clamp(u, -half, half), torch.clamp(v, -half, half)
        off_u, off_v = u - closest_u, v - closest_v
        gap = torch.sqrt(off_u * off_u + off_v * off_v)
        outside = gap > 0
        inv_gap = 1.0 / gap.clamp_min(1e-12)
        # Centre inside the square: the face it came through.
        through_u_face = u_prev.abs() >= v_prev.abs()
        face_sign = torch.where(torch.where(through_u_face, u_prev, v_prev) >= 0, 1.0, -1.0)
        depth = half - face_sign * torch.where(through_u_face, u, v)

        normal_u = torch.where(outside, off_u * inv_gap, torch.where(through_u_face, face_sign, 0.0))
        normal_v = torch.where(outside, off_v * inv_gap, torch.where(through_u_face, 0.0, face_sign))
        contact_u = torch.where(outside | ~through_u_face, closest_u, face_sign * half)
        contact_v = torch.where(outside | through_u_face, closest_v, face_sign * half)
        penetration = TCP_RADIUS + torch.where(outside, -gap, depth)
        touching = tcp[:, 2] - TCP_RADIUS < 2 * half
        push = torch.where(touching, penetration.clamp_min(0.0), 0.0)

        shift_u, shift_v = -normal_u * push, -normal_v * push
        torque = contact_u * shift_v - contact_v * shift_u
        lever_sq = contact_u * contact_u + contact_v * contact_v
        self.cube_yaw = self.cube_yaw + self.push_friction * torque / (2.0 / 3.0 * half * half + lever_sq)
        shift_x, shift_y = cos_yaw * shift_u - sin_yaw * shift_v, sin_yaw * shift_u + cos_yaw * shift_v
        self.cube_xy = self.cube_xy + torch.stack((shift_x, shift_y), -1)

    def _reward(self, distance_to_goal: torch.Tensor, success: torch.Tensor) -> torch.Tensor:
        """ManiSkill PushCube-v1's dense reward divided by its maximum (3), minus 1 (see the class doc)."""
        behind = (self.cube_half_size + TCP_RADIUS + PUSH_POINT_MARGIN).unsqueeze(-1)
        push_xy = self.cube_xy - behind * self.goal_dir_xy
        push_offset = torch.cat((push_xy, self.cube_half_size.unsqueeze(-1)), -1) - self.tcp_pos
        push_distance = torch.linalg.vector_norm(push_offset, dim=-1)
        reach = 1.0 - torch.tanh(5.0 * push_distance)
        place = 1.0 - torch.tanh(5.0 * distance_to_goal)
        reward = (reach + place * (push_distance < REACH_THRESHOLD)) / 3.0
        # Shifted by -1 so that reward <= 0 and success (0) is the best step: with success ending the
        # episode and no bootstrap through termination, a positive per-step reward would make staying
        # just short of the goal worth more than succeeding (ManiSkill's PPO hides this by bootstrapping
        # V(final_obs) through terminations too).
        return torch.where(success, 1.0, reward) - 1.0

    # ------------------------------------------------------------------ observations
    def _observe(self) -> torch.Tensor:
        """Flat float32 observation [N, 31] of the current state (plus observation noise)."""
        cube_pos = torch.cat((self.cube_xy, self.cube_half_size.unsqueeze(-1)), -1)
        goal_pos = torch.cat((self.goal_xy, torch.zeros_like(self.cube_yaw).unsqueeze(-1)), -1)
        yaw = self.cube_yaw.unsqueeze(-1)
        obs = torch.cat(
            (self.qpos, self.qvel, self.tcp_pos, cube_pos, torch.sin(yaw), torch.cos(yaw), goal_pos,
             cube_pos - self.tcp_pos, goal_pos - cube_pos),
            -1,
        )  # fmt: skip
        if self.obs_noise_std > 0:
            noise = torch.randn(obs.shape, generator=self._generator, device=self.device)
            obs = obs + self.obs_noise_std * noise
        return obs

    def _format_obs(self, flat_obs: torch.Tensor) -> torch.Tensor | TensorDict:
        """The flat observation in the env's obs_mode (state: as is; dict: nested TensorDict)."""
        if self.obs_mode == "state":
            return flat_obs
        pieces = flat_obs.split([size for _, _, size in OBS_LAYOUT], dim=-1)
        nested: dict[str, dict[str, torch.Tensor]] = {}
        for (group, name, _), piece in zip(OBS_LAYOUT, pieces):
            nested.setdefault(group, {})[name] = piece
        return TensorDict(nested, batch_size=[self.num_envs], device=self.device)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, torch.Tensor]:
        """All env state as plain tensors (clones), enough for a bit-identical continuation."""
        state = {key: getattr(self, key).clone() for key in STATE_KEYS}
        state["group_size"] = torch.tensor(self._group_size)
        state["generator_state"] = self._generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` returned (for the same num_envs)."""
        missing = set(STATE_KEYS) - set(state)
        if missing:
            raise KeyError(f"PushCubeRL.load_state_dict: missing keys {sorted(missing)}")
        for key in STATE_KEYS:
            current = getattr(self, key)
            if tuple(state[key].shape) != tuple(current.shape):
                raise ValueError(
                    f"PushCubeRL.load_state_dict: {key} has shape {tuple(state[key].shape)}, "
                    f"expected {tuple(current.shape)}"
                )
            setattr(self, key, state[key].to(device=self.device, dtype=current.dtype).clone())
        self._group_size = int(state["group_size"])
        self._generator.set_state(state["generator_state"].cpu())

    # ------------------------------------------------------------------ rendering
    def render(self, env_index: int = 0, height: int = 256, width: int = 256) -> np.ndarray:
        """Top-down RGB image (uint8 [height, width, 3]) of one env, drawn with tensor ops.

        Shows the table, the goal region (green disk, red centre), the cube (rotated blue square),
        the robot base, the arm links (grey, lighter when higher) and the TCP (disk, dark when low
        and yellow when high). x points right, y points up.
        """
        px, py = _pixel_grid(height, width, self.device)
        image = torch.empty(height, width, 3, device=self.device)
        image[:] = image.new_tensor(TABLE_COLOR)

        goal = self.goal_xy[env_index]
        _paint(image, _disk(px, py, goal, self.goal_radius), GOAL_REGION_COLOR, alpha=0.6)
        _paint(image, _disk(px, py, goal, 0.012), GOAL_CENTRE_COLOR)

        half, yaw = self.cube_half_size[env_index], self.cube_yaw[env_index]
        dx, dy = px - self.cube_xy[env_index, 0], py - self.cube_xy[env_index, 1]
        u, v = torch.cos(yaw) * dx + torch.sin(yaw) * dy, torch.cos(yaw) * dy - torch.sin(yaw) * dx
        _paint(image, (u.abs() <= half) & (v.abs() <= half), CUBE_COLOR)

        points = franka.forward_kinematics(self.qpos[env_index : env_index + 1], self.base_pos)[0]
        _paint(image, _disk(px, py, points[0, :2], 0.06), BASE_COLOR)
        segment_heights = 0.5 * (points[:-1, 2] + points[1:, 2])
        for i in segment_heights.argsort().tolist():  # lower links first, higher ones drawn over them
            shade = 0.35 + 0.5 * float(segment_heights[i].clamp(0.0, 0.8) / 0.8)
            mask = _segment(px, py, points[i, :2], points[i + 1, :2], LINK_HALF_WIDTH)
            _paint(image, mask, (shade, shade, shade), alpha=LINK_ALPHA)

        tcp = self.tcp_pos[env_index]
        height_level = float((tcp[2] / 0.3).clamp(0.0, 1.0))
        tcp_color = (0.3 + 0.7 * height_level, 0.3 + 0.6 * height_level, 0.1)
        pixel_size = (RENDER_X_RANGE[1] - RENDER_X_RANGE[0]) / width
        _paint(image, _disk(px, py, tcp[:2], max(TCP_RADIUS, 2.0 * pixel_size)), tcp_color)
        return (image * 255).round().to(torch.uint8).cpu().numpy()

    def close(self) -> None:
        """Nothing to release."""


def _check_args(num_envs, max_episode_steps, obs_mode, contact_substeps, goal_radius,
                cube_half_size, cube_half_size_range, push_friction_range, render_mode) -> None:  # fmt: skip
    """Raise ValueError with one clear line for a bad constructor argument."""
    problems = {
        "num_envs must be a positive integer": not isinstance(num_envs, (int, np.integer)) or num_envs < 1,
        "max_episode_steps must be >= 1": max_episode_steps < 1,
        "obs_mode must be 'state' or 'dict'": obs_mode not in ("state", "dict"),
        "contact_substeps must be >= 1": contact_substeps < 1,
        "goal_radius must be > 0": goal_radius <= 0,
        "cube_half_size must be > 0": cube_half_size <= 0,
        "cube_half_size_range must be (low, high) with 0 < low <= high": cube_half_size_range is not None
        and not (0 < cube_half_size_range[0] <= cube_half_size_range[1]),
        "push_friction_range must be (low, high) with low <= high": push_friction_range is not None
        and not (push_friction_range[0] <= push_friction_range[1]),
        "render_mode must be None or 'rgb_array'": render_mode not in (None, "rgb_array"),
    }
    for message, failed in problems.items():
        if failed:
            raise ValueError(f"PushCubeRL: {message}")


def _pixel_grid(height: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """World x and y [height, width] of the pixel centres of the top-down view."""
    (x0, x1), (y0, y1) = RENDER_X_RANGE, RENDER_Y_RANGE
    xs = x0 + (torch.arange(width, device=device) + 0.5) * ((x1 - x0) / width)
    ys = y1 - (torch.arange(height, device=device) + 0.5) * ((y1 - y0) / height)
    py, px = torch.meshgrid(ys, xs, indexing="ij")
    return px, py


def _disk(px: torch.Tensor, py: torch.Tensor, centre: torch.Tensor, radius: float) -> torch.Tensor:
    """Pixels within ``radius`` of the xy point ``centre``."""
    return (px - centre[0]) ** 2 + (py - centre[1]) ** 2 <= radius**2


def _segment(px: torch.Tensor, py: torch.Tensor, start: torch.Tensor, end: torch.Tensor, half_width: float):
    """Pixels within ``half_width`` of the xy segment from ``start`` to ``end``."""
    ex, ey = end[0] - start[0], end[1] - start[1]
    length_sq = (ex * ex + ey * ey).clamp_min(1e-12)
    t = (((px - start[0]) * ex + (py - start[1]) * ey) / length_sq).clamp(0.0, 1.0)
    return (px - start[0] - t * ex) ** 2 + (py - start[1] - t * ey) ** 2 <= half_width**2


def _paint(image: torch.Tensor, mask: torch.Tensor, color: tuple[float, float, float], alpha: float = 1.0):
    """Blend ``color`` into ``image`` [H, W, 3] where ``mask`` [H, W] is True."""
    blended = (1 - alpha) * image + alpha * image.new_tensor(color)
    image.copy_(torch.where(mask.unsqueeze(-1), blended, image))
