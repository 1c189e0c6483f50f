"""PushCubeRL's env class: ``PushCubeRLVecEnv`` (and ``PushCubeLangRLVecEnv``, its language-conditioned tasks).

The class holds the task's state tensors and what a step does with them: the constructor (the arguments, the
per-env state, the constants), reset and the fresh starts, the events, ``step``, the reward, and
``state_dict`` / ``load_state_dict``. It inherits the arm and the cube (``arm.PushCubeArm``), the observations
(``obs.PushCubeObs``) and the renderers (``render.PushCubeRenderer``): methods of this env that read and write its
state tensors, kept in their own modules. What the task is: the package's docstring (``push_cube/__init__.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch

from cleanrl_embodied.shared.envs.push_cube import franka
from cleanrl_embodied.shared.envs.push_cube.arm import PushCubeArm
from cleanrl_embodied.shared.envs.push_cube.obs import PushCubeObs
from cleanrl_embodied.shared.envs.push_cube.options import (
    CUBE_ENTRIES,
    CUBE_FRICTION,
    DEFAULT_DROPOUT_RATE,
    DEFAULT_DROPOUT_STEPS,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_INSTRUCTION_LENGTH,
    DEFAULT_OBS_CAMERAS,
    DEFAULT_REWARD_WEIGHTS,
    DROPOUT_STATE_KEYS,
    EE_DELTA_SCALE,
    HELDOUT_INSTRUCTIONS,
    IMAGE_OBS_MODES,
    JOINT_DELTA_SCALE,
    LANG_TASKS,
    OBS_LAYOUT,
    PUSH_POINT_MARGIN,
    REACH_THRESHOLD,
    REST_QPOS_NOISE,
    SLIDING_OBS_LAYOUT,
    SLIDING_STATE_KEYS,
    STATE_KEYS,
    TASKS,
    TCP_RADIUS,
    _check_args,
    _is_int,
)
from cleanrl_embodied.shared.envs.push_cube.render import PushCubeRenderer
from cleanrl_embodied.shared.language import encode_instructions


class PushCubeRLVecEnv(PushCubeArm, PushCubeObs, PushCubeRenderer, gym.vector.VectorEnv):
    """Batched PushCube task on torch tensors (Gymnasium vector API, SAME_STEP autoreset).

    Observation (state mode, float32 [N, 31]): qpos (7), qvel (7), tcp_pos (3), cube_pos (3),
    sin/cos of the cube yaw (2), goal_pos (3), tcp->cube (3), cube->goal (3); with ``cube_dynamics="sliding"``
    also the cube's velocity (2, world xy), [N, 33] (``self.obs_dim``). ``obs_mode="dict"``
    returns the same values as a nested TensorDict {"robot", "object", "goal"} of batch size [N].
    ``obs_mode="rgb"`` returns a TensorDict {"rgb": uint8 [N, 3, H, W]}, ``"proprio+rgb"`` adds the robot's
    own state {"state": float32 [N, 17]} (qpos, qvel, tcp_pos: what ManiSkill's rgb mode gives a policy
    besides the camera; cube and goal are seen only in the image) and ``"state+rgb"`` the full state
    {"state": float32 [N, 31]} (``image_size``, default 64 x 64); ``obs_cameras=("top", "wrist")`` adds the wrist
    camera's image {"wrist": uint8 [N, 3, H, W]} (``("wrist",)``: that one alone, no "rgb");
    ``info["final_obs"]`` has the same structure. Observation noise applies to the state only.

    Observation camera "top" (rgb modes, the entry "rgb"): top-down and orthographic (image columns along +x, rows
    along -y), cropped to the region where the cube, the goal and the pushing TCP can be: the cube spawn square and
    the goals it implies (that square shifted by ``goal_distance`` toward ``goal_direction``), widened by the largest
    cube's push point and ``OBS_VIEW_MARGIN``, in square pixels. With the defaults it shows x in [-0.165, 0.365] and
    y in [-0.265, 0.265] m, 8.3 mm per pixel at 64 x 64, so the cube is about 5 pixels wide. The scene is a
    height map: every primitive writes the pixels it covers where it is higher than what is there (one
    scatter-max of height|material keys per primitive), so the draw order needs no per-env sorting. Shown: the
    table (grey), the goal region (light green disk of ``goal_radius``) and its centre (dark green), the cube's
    top face (blue, turned by its yaw), the TCP (a disk on top of everything, coloured by its height: red at the
    table through orange to yellow at 0.25 m and above, 32 levels), the TCP's shadow (a dark disk on the table
    or the cube top, shifted toward -y by half the TCP's height above that surface, so it touches the TCP only
    when the TCP is down) and the arm links (see-through grey bands 2 pixels wide, lighter when higher; the
    shoulder and the base lie outside the view). Every primitive is drawn in a small tile of pixels around it
    (the links as 2 x 2 pixel blocks one pixel apart), so an image costs a few passes over its pixels plus a
    few hundred pixels of drawing per env. A step draws the images twice (the final state and, after the
    autoreset, the current one), so rgb modes step much slower than the state mode, which draws nothing.

    Wrist camera (``obs_cameras`` holding "wrist", the entry "wrist"): the same drawing through a top-down window
    ``WRIST_VIEW_WIDTH`` (0.2 m) wide centred on each env's TCP, which moves with it (axis-aligned with the world: it
    does not turn with the hand), 3.1 mm per pixel at 64 pixels wide, so the 4 cm cube is about 13 pixels wide and
    fills a good part of the image when the TCP is at it. The TCP's disk is always at the centre (its colour still
    tells its height, and its shadow's offset too); the arm links are not drawn (a camera on the hand does not see
    the arm behind it). Both views share the drawing code (``_ObsView``: pixel size, window edges, tiles, link
    points); a primitive whose tile would hold more pixels than the image (the goal region, 0.1 m in radius) is drawn
    over the whole image in place. With both cameras a step draws four images and costs 1.5-1.6 times a top-only step
    at 64 x 64 on a CPU, about 2-2.3 times at 128 x 128 (docs/push-cube.md).

    Cube dynamics (``cube_dynamics``): ``"kinematic"`` (default) moves a pushed cube by exactly the TCP's
    penetration and leaves it there; ``"sliding"`` also gives it the TCP's velocity along the contact normal,
    after which it slides on, slowed by Coulomb friction with the table (``cube_friction`` mu, default 0.5:
    from speed v it stops after v^2 / (2 mu g)); its velocity is observed (33-dim state) and saved with the
    state. Default PPO learns both about equally fast; with sliding, solved episodes are ~14% shorter, a push
    carrying the cube a little further (docs/push-cube.md).

    Tasks (``tasks``, the PushCubeLangRL id): each episode draws one of several named tasks, a goal direction
    with an instruction (``TASKS``: "push the cube forward", "... to the left", "... back", "... to the right"), so
    that the same starts call for different pushes and only the instruction tells which. The observation is then
    a TensorDict that holds the instruction tokens (``"instruction"``: ``input_ids`` and ``attention_mask``
    [N, ``instruction_length``], see ``shared.language``) and no goal: the state leaves out goal_pos and
    cube_to_goal ([N, 25]; "state" mode gives {"state", "instruction"}), and the images draw no goal region.
    ``info["task_id"]`` [N] (long) is the task of the step's episode (of the finished one where an episode
    ended) and ``metadata["task_names"]`` names them; success, reward and ``render()`` (videos) use the task's goal.

    Sensor dropout (``dropout_sensor``): a sensor goes missing for stretches of control steps, as a real one does (a
    mocap marker occluded, a camera frame dropped), which makes the task partially observable. ``"cube"``: every
    state entry derived from the cube's pose (``CUBE_ENTRIES``: cube_pos, cube_yaw_sincos, tcp_to_cube, cube_to_goal,
    cube_vel where present; obs_mode "state", "dict" or "state+rgb"); ``"camera"``: every image entry (all of
    ``obs_cameras`` at once; the image modes). Per env and step a working sensor starts an outage with probability
    ``dropout_rate``, lasting a uniform whole number of steps in ``dropout_steps`` (drawn from the env's generator
    on its device, batched, no host sync); at least one real reading follows each outage, so the sensor is out
    ``p m / (1 + p m)`` of the steps (rate p, mean length m) where episodes are long. While it is out its entries
    read zeros (an image: all-zero pixels), not a stale copy, so that only a policy's memory can carry what it saw
    last, and the 0/1 float ``sensor_missing`` says so: appended to the state vector (state mode [N, 32]; the
    "state" entry of "proprio+rgb" [N, 18] and "state+rgb" [N, 32]), an entry {"sensor_missing": [N, 1]} in the dict
    and rgb modes. An outage in progress ends at a reset: the first observation of an episode is always a real
    reading. "privileged" always holds the true state. The countdown (``sensor_outage``) and the episode's count of
    missing readings are env state (``state_dict``); ``info["metrics"]["sensor_missing_fraction"]`` is the share of
    the episode's steps so far whose reading was missing. Without ``dropout_sensor`` nothing changes (no draws).

    Action in [-1, 1]: 7 joint deltas (``action_mode="joint_delta"``, ``joint_delta_scale`` rad at 1),
    7 absolute joint positions (``"joint_pos"``, -1..1 spans each joint's range) or 3 TCP deltas in the
    world frame (``"ee_delta_pos"``, ``ee_delta_scale`` m at 1).

    Reward: the weighted sum of the terms in ``DEFAULT_REWARD_WEIGHTS`` (``reward_weights`` overrides some
    weights); ``info["rewards"]`` holds each term with a non-zero weight, weighted, [N] per step. The
    defaults are ManiSkill PushCube-v1's normalized dense reward shifted down by 1: with the push point a
    little behind the cube on the side away from the goal (at cube-centre height),
    ``reach = 1 - tanh(5 d_push)``, ``place = 1 - tanh(5 d_goal)``, reward
    ``(reach + place * [d_push < 0.01]) / 3 - 1`` (in [-1, -1/3]), and 0 on success. Success: the cube
    centre lies within ``goal_radius`` of the goal in xy. The shift matters because success ends the
    episode: with ManiSkill's positive rewards (1 on success) hovering at the push point forever is
    worth more than finishing once termination is not bootstrapped, and PPO (gamma 0.8) learns to
    hover (0 % success); with rewards <= 0 finishing is best.

    World frame: table top at z = 0, robot base at ``base_pos`` (ManiSkill's (-0.615, 0, 0)). The
    rest-pose TCP sits at (0, 0, 0.170), right above the centre of the cube spawn square, so the
    push point (about 0.15 m below and at most 0.17 m aside) is a few control steps away.
    """

    metadata = {
        "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP,
        "render_modes": ["rgb_array"],
        "render_fps": 20,
    }
    partial_reset = True  # reset(options={"reset_mask": mask}) resets just those envs

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        max_episode_steps: int = 50,
        obs_mode: str = "state",
        action_mode: str = "joint_delta",
        joint_delta_scale: float = JOINT_DELTA_SCALE,
        ee_delta_scale: float = EE_DELTA_SCALE,
        arm_limits: bool = True,
        max_tcp_speed: float = franka.MAX_TCP_SPEED,
        terminate_on_success: bool = True,
        goal_direction: float = 0.0,
        goal_distance: float = 0.2,
        goal_radius: float = 0.1,
        cube_half_size: float = 0.02,
        cube_xy_range: float = 0.1,
        cube_yaw_range: float = 0.0,
        contact_substeps: int = 8,
        cube_dynamics: str = "kinematic",
        cube_friction: float = CUBE_FRICTION,
        cube_half_size_range: Sequence[float] | None = None,
        push_friction: float = 1.0,
        push_friction_range: Sequence[float] | None = None,
        obs_noise_std: float = 0.0,
        action_noise_std: float = 0.0,
        reward_weights: Mapping[str, float] | None = None,
        randomize: Mapping[str, Sequence[float]] | None = None,
        randomize_every: int = 0,
        randomize_at: Sequence[int] = (),
        event_cube_shift_std: float = 0.0,
        base_pos: Sequence[float] = franka.DEFAULT_BASE_POS,
        camera: str = "top",
        render_mode: str | None = "rgb_array",
        image_size: int | Sequence[int] = DEFAULT_IMAGE_SIZE,
        obs_cameras: Sequence[str] = DEFAULT_OBS_CAMERAS,
        tasks: Sequence[str] | None = None,
        instruction_length: int = DEFAULT_INSTRUCTION_LENGTH,
        instructions: str = "train",
        privileged_state: bool = False,
        view_tasks: Sequence[str] | None = None,
        dropout_sensor: str | None = None,
        dropout_rate: float = DEFAULT_DROPOUT_RATE,
        dropout_steps: Sequence[int] = DEFAULT_DROPOUT_STEPS,
    ):
        """Build the batched task. Every argument is checked; a bad one raises ValueError naming it.

        Args:
            num_envs: number of parallel envs N.
            device: torch device holding all state.
            seed: seed of the env's own generator (None: a random seed).
            max_episode_steps: control steps before an episode is truncated.
            obs_mode: "state" (flat float32 [N, 31]), "dict" (nested TensorDict), "rgb" (TensorDict {"rgb":
                uint8 [N, 3, H, W]} from the observation camera, see the class docstring), "proprio+rgb"
                ({"state": float32 [N, 17] (qpos, qvel, tcp_pos), "rgb"}) or "state+rgb" ({"state": float32
                [N, 31], "rgb"}).
            action_mode: "joint_delta" (7 joint deltas), "joint_pos" (7 absolute joint positions, -1..1
                spanning each joint's limits) or "ee_delta_pos" (3 TCP deltas in the world frame, through the
                damped least-squares inverse of the TCP Jacobian).
            joint_delta_scale: radians per control step at action 1 (joint_delta).
            ee_delta_scale: metres of TCP motion per control step at action 1 (ee_delta_pos).
            arm_limits: apply the Panda's joint velocity and acceleration limits and the TCP speed cap;
                False: the old arm that reaches each step's target at once.
            max_tcp_speed: TCP speed cap in m/s (with arm_limits; the Panda's 1.7 by default).
            terminate_on_success: end the episode (terminated) as soon as the cube reaches the goal;
                when False every episode lasts max_episode_steps (ManiSkill's ignore_terminations).
            goal_direction: direction from the cube's start to the goal, radians (0 = +x).
            goal_distance: distance from the cube's start to the goal, metres (> goal_radius).
            goal_radius: success when the cube centre is closer than this to the goal (xy).
            cube_half_size: half the cube's side, metres (when not randomized).
            cube_xy_range: the cube starts uniformly in [-range, range]^2.
            cube_yaw_range: the cube's start yaw is uniform in [-range, range] radians.
            contact_substeps: straight sub-steps of the TCP path per control step for contact.
            cube_dynamics: "kinematic" (a push moves the cube by exactly the penetration, then it stops) or
                "sliding" (a push gives the cube the TCP's velocity along the contact normal and the cube
                slides on, slowed by friction; its velocity is observed and saved with the state).
            cube_friction: Coulomb friction coefficient mu of the sliding cube on the table (deceleration
                mu * 9.81 m/s^2; cube_dynamics="sliding" only).
            cube_half_size_range: (low, high), same as ``randomize={"cube_half_size": (low, high)}``.
            push_friction: how strongly an off-centre push turns the cube (0: never turns).
            push_friction_range: (low, high), same as ``randomize={"push_friction": (low, high)}``.
            obs_noise_std: std of Gaussian noise added to every observation entry.
            action_noise_std: std of Gaussian noise added to the clipped action (then clipped again).
            reward_weights: weights of some reward terms (the others keep DEFAULT_REWARD_WEIGHTS).
            randomize: {parameter: (low, high)} resampled uniformly per env at every reset and at every
                event; parameters: cube_half_size, push_friction, obs_noise_std, action_noise_std.
            randomize_every: also resample them every this many control steps of each episode (0: never).
            randomize_at: also resample them after these control steps of each episode (e.g. [10, 30]).
            event_cube_shift_std: at every interval or step event, shift the cube by Gaussian noise in xy
                with this std (metres), a disturbance the policy has to recover from.
            base_pos: world position of the robot base.
            camera: view of ``render()``: "top" (top-down, default), "front", "side" or "perspective".
            render_mode: only "rgb_array" (kept for Gymnasium's make_vec).
            image_size: size of the image observations (rgb modes): an int for square images or (H, W).
            obs_cameras: the cameras of the image observations (rgb modes), each its own uint8 [N, 3, H, W] entry:
                ("top",) (default: "rgb", the fixed top-down view), ("wrist",) ("wrist", a top-down view that
                follows the TCP) or ("top", "wrist") (both); see the class docstring.
            tasks: names of ``TASKS`` drawn uniformly per episode (language-conditioned, see the class
                docstring); None: the single task of ``goal_direction``.
            instruction_length: bytes of instruction tokens in the observation (with ``tasks``).
            instructions: which words name the tasks (with ``tasks``): "train" (``TASKS``' instruction, the one
                every training run uses) or "heldout" (per episode one of the task's ``HELDOUT_INSTRUCTIONS``, drawn
                after everything else, so a seed's first episodes have the same starts and tasks as with "train":
                an evaluation of generalisation to paraphrases on paired episodes).
            privileged_state: image modes only: the observation also holds the "state" mode's vector (the cube's
                and the goal's poses included) under "privileged" (``shared.PRIVILEGED_KEY``), for a critic
                that sees what the simulator knows (``--privileged-critic``); an actor never reads it.
            view_tasks: names of ``TASKS`` whose goal regions the top camera's window covers (rgb modes); None: the
                env's own tasks (or its ``goal_direction``). Envs with other tasks see the table through the same
                window when they name the same ``view_tasks`` (e.g. a target task and the tasks a policy was
                pretrained on; the four of ``LANG_TASKS`` give PushCubeLangRL's window).
            dropout_sensor: a sensor that goes missing for stretches of steps (see the class docstring): None (never),
                "cube" (the state entries derived from the cube's pose; obs_mode "state", "dict" or "state+rgb") or
                "camera" (every image entry; the image modes). Adds the 0/1 entry ``sensor_missing``.
            dropout_rate: probability per env and step that a working sensor starts an outage.
            dropout_steps: (min, max): an outage lasts a uniform whole number of control steps in [min, max].
        """
        ranges = _check_args(locals())
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.render_mode = render_mode
        self.obs_mode = obs_mode
        self.privileged_state = bool(privileged_state)
        self.action_mode = action_mode
        self.joint_delta_scale = float(joint_delta_scale)
        self.ee_delta_scale = float(ee_delta_scale)
        self.arm_limits = bool(arm_limits)
        self.max_tcp_speed = float(max_tcp_speed)
        self.max_episode_steps = int(max_episode_steps)
        self.terminate_on_success = bool(terminate_on_success)
        self.goal_distance = goal_distance
        self.goal_radius = goal_radius
        self.cube_xy_range = cube_xy_range
        self.cube_yaw_range = cube_yaw_range
        self.contact_substeps = int(contact_substeps)
        self.cube_dynamics = cube_dynamics
        self.cube_friction = float(cube_friction)
        self._sliding = cube_dynamics == "sliding"
        self.task_names = tuple(tasks) if tasks is not None else None
        self.obs_layout = SLIDING_OBS_LAYOUT if self._sliding else OBS_LAYOUT
        if self.task_names:  # the instruction says where the goal is: the state doesn't
            self.obs_layout = tuple(e for e in self.obs_layout if e[1] not in ("goal_pos", "cube_to_goal"))
            self.metadata = {**type(self).metadata, "task_names": self.task_names}
        self.obs_dim = sum(size for _, _, size in self.obs_layout)
        self._heldout = bool(tasks) and instructions == "heldout"
        self._state_keys = (*(SLIDING_STATE_KEYS if self._sliding else STATE_KEYS), *(("task",) if tasks else ()),
                            *(("phrase",) if self._heldout else ()))  # fmt: skip
        self.instruction_length = int(instruction_length)
        self.param_ranges = ranges
        self.reward_weights = {**DEFAULT_REWARD_WEIGHTS, **(reward_weights or {})}
        self._active_terms = [name for name, w in self.reward_weights.items() if w != 0.0]
        self.randomize_every = int(randomize_every)
        self.randomize_at = tuple(int(k) for k in randomize_at)
        self.event_cube_shift_std = float(event_cube_shift_std)
        self._has_events = bool(self.randomize_every or self.randomize_at)
        self._obs_noise = ranges["obs_noise_std"][1] > 0
        self._action_noise = ranges["action_noise_std"][1] > 0
        self.base_pos = tuple(float(v) for v in base_pos)
        self.camera = camera
        self.image_size = (int(image_size), int(image_size)) if _is_int(image_size) else tuple(map(int, image_size))
        self._images = obs_mode in IMAGE_OBS_MODES
        self.obs_cameras = tuple(obs_cameras)
        self.dropout_sensor = dropout_sensor
        self.dropout_rate = float(dropout_rate)
        self.dropout_steps = (int(dropout_steps[0]), int(dropout_steps[1]))
        self._dropout = dropout_sensor is not None
        if self._dropout:
            self._state_keys = (*self._state_keys, *DROPOUT_STATE_KEYS)
            columns = [name in CUBE_ENTRIES for _, name, size in self.obs_layout for _ in range(size)]
            self._cube_columns = torch.tensor(columns, dtype=torch.bool, device=self.device)

        self._build_spaces()
        self._setup_arm(contact_substeps)  # the arm's limits and the contacts' constants (arm.py)
        self.goal_dir_xy = torch.tensor(
            [math.cos(goal_direction), math.sin(goal_direction)], dtype=torch.float32, device=self.device
        )
        directions = [TASKS[name][0] for name in self.task_names or ()]
        self._task_dirs = torch.tensor(
            [[math.cos(a), math.sin(a)] for a in directions], dtype=torch.float32, device=self.device
        ).view(-1, 2)  # [num tasks, 2]
        if self.task_names:  # row task * phrases + phrase: the instruction of a task's phrase
            phrases = [HELDOUT_INSTRUCTIONS[n] if self._heldout else (TASKS[n][1],) for n in self.task_names]
            self._phrases_per_task = len(phrases[0])
            texts = [text for task in phrases for text in task]
            self._task_tokens = encode_instructions(texts, self.instruction_length, self.device)
        self._randomize_at = torch.tensor(self.randomize_at, dtype=torch.int32, device=self.device)
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._group_size = 1
        for key, value in self._sample_start_state().items():
            setattr(self, key, value)
        if self._images:
            view = [TASKS[name][0] for name in view_tasks] if view_tasks is not None else directions
            self._setup_obs_camera(view or [goal_direction])

    # ------------------------------------------------------------------ reset
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every env. ``seed`` reseeds the env's generator; ``options={"group_size": G}`` makes
        consecutive groups of G envs start identically (also at their later autoresets);
        ``options={"reset_mask": mask}`` ([N] bool) resets only the envs in ``mask`` (Gymnasium's partial reset;
        the other rows of the returned observation are the envs' current ones)."""
        mask = (options or {}).get("reset_mask")
        if mask is not None:
            mask = torch.as_tensor(mask, dtype=torch.bool, device=self.device)
            if seed is not None or mask.shape != (self.num_envs,):
                raise ValueError(
                    f"PushCubeRL: reset_mask must be a bool [{self.num_envs}] mask, without a seed, "
                    f"got shape {tuple(mask.shape)} and seed {seed!r}"
                )
            self._reset_finished(mask)
        else:
            if seed is not None:
                self._generator.manual_seed(seed)
            self._group_size = self._parse_group_size(options)
            for key, value in self._sample_start_state().items():
                setattr(self, key, value)
        info = {"task_id": self.task} if self.task_names else {}
        return self._format_obs(self._observe(), self._render_images() if self._images else None), info

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

    def _per_group(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Per-group samples [N / G, ...] repeated over the envs of each group -> [N, ...]."""
        if self._group_size == 1:
            return list(tensors)
        return [t.repeat_interleave(self._group_size, dim=0) for t in tensors]

    def _sample_parameters(self, num_groups: int) -> dict[str, torch.Tensor]:
        """Per-group values of the randomizable parameters. cube_half_size and push_friction are always
        drawn (in this order, as before events existed); the others only when their range is not a point."""
        params = {name: self._uniform(num_groups, *self.param_ranges[name])
                  for name in ("cube_half_size", "push_friction")}  # fmt: skip
        for name in ("obs_noise_std", "action_noise_std"):
            low, high = self.param_ranges[name]
            params[name] = (self._uniform(num_groups, low, high) if high > low
                            else torch.full((num_groups,), float(low), device=self.device))  # fmt: skip
        return params

    def _sample_start_state(self) -> dict[str, torch.Tensor]:
        """Fresh initial state for all N envs (one sample per group, repeated over its envs)."""
        num_groups = self.num_envs // self._group_size
        noise = self._uniform(num_groups, -REST_QPOS_NOISE, REST_QPOS_NOISE, franka.NUM_JOINTS)
        qpos = self.rest_qpos + noise
        cube_xy = self._uniform(num_groups, -self.cube_xy_range, self.cube_xy_range, 2)
        cube_yaw = self._uniform(num_groups, -self.cube_yaw_range, self.cube_yaw_range)
        params = self._sample_parameters(num_groups)
        qpos, cube_xy, cube_yaw = self._per_group(qpos, cube_xy, cube_yaw)
        params = dict(zip(params, self._per_group(*params.values())))
        qpos = self._clip_to_limits(qpos)
        goal_dir = self.goal_dir_xy
        task = {}
        if self.task_names:  # drawn after everything else: a seed gives PushCubeRL's starts with a task on top
            drawn = torch.randint(len(self.task_names), (num_groups,), generator=self._generator, device=self.device)
            task["task"] = self._per_group(drawn)[0]
            goal_dir = self._task_dirs[task["task"]]
            if self._heldout:
                drawn = torch.randint(self._phrases_per_task, (num_groups,), generator=self._generator,
                                      device=self.device)  # fmt: skip
                task["phrase"] = self._per_group(drawn)[0]
        dropout = {}  # sensor dropout: an episode starts with a working sensor and no missing readings
        if self._dropout:
            zeros = torch.zeros(self.num_envs, dtype=torch.int32, device=self.device)
            dropout = {key: zeros.clone() for key in DROPOUT_STATE_KEYS}
        return {
            "qpos": qpos,
            "qvel": torch.zeros_like(qpos),
            "tcp_pos": franka.tcp_position(qpos, self.base_pos),
            "cube_xy": cube_xy,
            "cube_yaw": cube_yaw,
            "goal_xy": cube_xy + self.goal_distance * goal_dir,
            **params,
            "prev_action": torch.zeros(self.action_space.shape, device=self.device),
            "elapsed_steps": torch.zeros(self.num_envs, dtype=torch.int32, device=self.device),
            **({"cube_vel": torch.zeros_like(cube_xy)} if self._sliding else {}),
            **task,
            **dropout,
        }

    def _reset_finished(self, done: torch.Tensor) -> None:
        """Replace the state of envs where ``done`` with a fresh start (no host sync).

        Floats are picked by ``lerp(current, fresh, done)`` with weights 0 or 1 (exact for finite values and
        several times cheaper than ``torch.where`` on a CPU), with the weights expanded to each width once."""
        start = self._sample_start_state()
        weight = done.float()
        weights = {1: weight}
        for key, fresh in start.items():
            current = getattr(self, key)
            if not current.is_floating_point():
                setattr(self, key, torch.where(done, fresh, current))
                continue
            width = 1 if current.dim() == 1 else current.shape[1]
            if width not in weights:
                weights[width] = weight.unsqueeze(-1).expand(self.num_envs, width).contiguous()
            setattr(self, key, torch.lerp(current, fresh, weights[width]))

    def randomize_parameters(self, mask: torch.Tensor | None = None) -> None:
        """Resample the randomized parameters (``randomize``) now, mid-episode: of every env, or of the envs
        where ``mask`` [N] is True (an event; groups keep sharing their values)."""
        num_groups = self.num_envs // self._group_size
        params = self._sample_parameters(num_groups)
        for name, fresh in zip(params, self._per_group(*params.values())):
            setattr(self, name, fresh if mask is None else torch.where(mask, fresh, getattr(self, name)))

    def _run_events(self) -> None:
        """Interval and step-triggered events of the envs whose episode reached such a step (no host sync):
        resample the randomized parameters and shove the cube (``event_cube_shift_std``)."""
        steps = self.elapsed_steps
        due = torch.zeros_like(steps, dtype=torch.bool)
        if self.randomize_every:
            due = due | ((steps > 0) & (steps % self.randomize_every == 0))
        if self.randomize_at:
            due = due | torch.isin(steps, self._randomize_at)
        self.randomize_parameters(due)
        if self.event_cube_shift_std > 0:
            shift = torch.randn(self.cube_xy.shape, generator=self._generator, device=self.device)
            self.cube_xy = self.cube_xy + torch.where(due.unsqueeze(-1), self.event_cube_shift_std * shift, 0.0)

    # ------------------------------------------------------------------ step
    def step(self, actions: torch.Tensor):
        """Apply actions [N, 7] (or [N, 3] in ee_delta_pos mode); finished envs are reset in the same call
        (SAME_STEP). ``info["rewards"]`` holds the weighted reward terms, which sum to the reward."""
        actions = torch.as_tensor(actions, dtype=torch.float32, device=self.device).clamp(-1.0, 1.0)
        if self._has_events:
            self._run_events()
        command = actions
        if self._action_noise:
            noise = torch.randn(actions.shape, generator=self._generator, device=self.device)
            command = (actions + self.action_noise_std.unsqueeze(-1) * noise).clamp(-1.0, 1.0)

        tcp_before = self.tcp_pos
        self._move_arm(command)
        self._resolve_contacts(tcp_before, self.tcp_pos)
        self.elapsed_steps = self.elapsed_steps + 1

        distance_to_goal = torch.linalg.vector_norm(self.cube_xy - self.goal_xy, dim=-1)
        success = distance_to_goal < self.goal_radius
        reward, terms = self._reward(distance_to_goal, success, actions)
        terminated = success.clone() if self.terminate_on_success else torch.zeros_like(success)
        truncated = self.elapsed_steps >= self.max_episode_steps
        done = terminated | truncated
        if self._dropout:
            missing_fraction = self._advance_dropout()

        final_obs = self._observe()
        final_images = self._render_images() if self._images else None
        final_task = self.task if self.task_names else None
        final_obs = self._format_obs(final_obs, final_images)  # (the finished episodes' instructions)
        self.prev_action = actions
        self._reset_finished(done)
        obs = self._observe()
        images = self._render_images() if self._images else None
        info = {
            "final_obs": final_obs,
            "_final_obs": done,
            "success": success,
            "rewards": terms,
            "metrics": {"distance_to_goal": distance_to_goal},
        }
        if self._dropout:
            info["metrics"]["sensor_missing_fraction"] = missing_fraction
        if final_task is not None:
            info["task_id"] = final_task
        return self._format_obs(obs, images), reward, terminated, truncated, info

    def goal_direction(self) -> torch.Tensor:
        """Unit vector [2] (one task) or [N, 2] (``tasks``) from each cube's start toward its goal."""
        return self._task_dirs[self.task] if self.task_names else self.goal_dir_xy

    def _reward(self, distance_to_goal: torch.Tensor, success: torch.Tensor, actions: torch.Tensor):
        """The reward [N] and its weighted terms {name: [N]} (see DEFAULT_REWARD_WEIGHTS); the reward is their
        sum, in the order of DEFAULT_REWARD_WEIGHTS. Only terms with a non-zero weight are computed."""
        weights = self.reward_weights
        terms: dict[str, torch.Tensor] = {}
        if weights["reach"] or weights["place"]:
            behind = (self.cube_half_size + TCP_RADIUS + PUSH_POINT_MARGIN).unsqueeze(-1)
            push_xy = self.cube_xy - behind * self.goal_direction()
            push_offset = torch.cat((push_xy, self.cube_half_size.unsqueeze(-1)), -1) - self.tcp_pos
            push_distance = torch.linalg.vector_norm(push_offset, dim=-1)
            if weights["reach"]:
                reach = 1.0 - torch.tanh(5.0 * push_distance)
                terms["reach"] = weights["reach"] * torch.where(success, 0.0, reach)
            if weights["place"]:
                place = (1.0 - torch.tanh(5.0 * distance_to_goal)) * (push_distance < REACH_THRESHOLD)
                terms["place"] = weights["place"] * torch.where(success, 0.0, place)
        if weights["success"]:
            terms["success"] = weights["success"] * success.float()
        if weights["time"]:
            terms["time"] = torch.full_like(distance_to_goal, -weights["time"])
        if weights["action_rate"]:
            terms["action_rate"] = -weights["action_rate"] * (actions - self.prev_action).square().sum(-1)
        if weights["action_magnitude"]:
            terms["action_magnitude"] = -weights["action_magnitude"] * actions.square().sum(-1)
        # The time cost makes every step cost and success (0 with the defaults) the best step: with success
        # ending the episode and no bootstrap through termination, a positive per-step reward would make staying
        # just short of the goal worth more than succeeding (ManiSkill's PPO hides this by bootstrapping
        # V(final_obs) through terminations too).
        reward = torch.zeros_like(distance_to_goal)
        for value in terms.values():
            reward = reward + value
        return reward, terms

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, torch.Tensor]:
        """All env state as plain tensors (clones), enough for a bit-identical continuation."""
        state = {key: getattr(self, key).clone() for key in self._state_keys}
        state["group_size"] = torch.tensor(self._group_size)
        state["generator_state"] = self._generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` returned (for the same num_envs)."""
        missing = set(self._state_keys) - set(state)
        if missing:
            raise KeyError(
                f"PushCubeRL.load_state_dict: missing keys {sorted(missing)}"
                + (" (a state saved with cube_dynamics='kinematic'?)" if "cube_vel" in missing else "")
            )
        for key in self._state_keys:
            current = getattr(self, key)
            if tuple(state[key].shape) != tuple(current.shape):
                raise ValueError(
                    f"PushCubeRL.load_state_dict: {key} has shape {tuple(state[key].shape)}, "
                    f"expected {tuple(current.shape)}"
                )
            setattr(self, key, state[key].to(device=self.device, dtype=current.dtype).clone())
        self._group_size = int(state["group_size"])
        self._generator.set_state(state["generator_state"].cpu())

    def close(self) -> None:
        """Nothing to release."""


class PushCubeLangRLVecEnv(PushCubeRLVecEnv):
    """PushCubeLangRL: PushCubeRL with its four language-conditioned tasks, ``LANG_TASKS`` (unless ``tasks`` says
    otherwise); see ``PushCubeRLVecEnv``'s "Tasks"."""

    def __init__(self, *args, tasks: Sequence[str] | None = LANG_TASKS, **kwargs):
        super().__init__(*args, tasks=tasks, **kwargs)
