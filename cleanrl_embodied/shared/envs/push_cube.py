"""PushCubeRL: a kinematic Franka Panda pushes a cube to a goal on a table, batched in torch.

The task follows ManiSkill's PushCube-v1 (same robot, rest pose, base position and dense reward, shifted
down by 1), with the physics replaced by a few batched tensor ops so that thousands of envs step on a CPU:

* Robot: kinematic (no dynamics). Each control step (20 Hz) the action gives the joint displacement the
  controller aims at (``action_mode``: joint deltas, absolute joint positions, or a TCP displacement turned
  into joint deltas through the Jacobian). With ``arm_limits=True`` (the default) the Panda's datasheet
  limits shape how the arm gets there, see ``_limit_joint_step``: the joint velocity held over the step is
  the one that reaches the step's target, capped so that the joint can still stop at the target, then
  kept within the acceleration limit (``a_max * dt`` of velocity change per step) and the velocity limit,
  and the whole step is scaled down when the TCP would move faster than ``max_tcp_speed`` (1.7 m/s).
  ``arm_limits=False`` is the old kinematic arm that reaches every target at once (up to ~4 m/s TCP speed).
  Joint positions always stay within the joint limits.
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
  motion is 0.085 m per step with the arm limits (about 0.21 m near the table without them).
  ``cube_dynamics="sliding"`` gives the cube a velocity instead: a push sets the cube's velocity along the
  contact normal to the TCP's (a perfectly inelastic hit by the much heavier arm, tangential velocity
  kept), and the cube keeps sliding after the contact, slowed by Coulomb friction with the table
  (``cube_friction`` mu: mu * g of deceleration, so a cube at speed v stops after v^2 / (2 mu g)). Pushes
  still move it out of the TCP sphere, so the arm never passes through it; it turns only while pushed.
* Reward: named terms with weights (``reward_weights``), each step's weighted terms in
  ``info["rewards"]``; the default weights give ManiSkill's normalized dense reward minus 1.
* Events: physical parameters and noise levels are resampled at every reset (``randomize``), and
  optionally every K steps of an episode (``randomize_every``) or at given episode steps
  (``randomize_at``), with an optional random shove of the cube (``event_cube_shift_std``).

This module holds the raw task only: episode statistics are added by a wrapper. All state lives in
torch tensors on ``device``; ``step`` has no Python loop over envs and never syncs with the host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from cleanrl_embodied.shared.envs import franka
from cleanrl_embodied.shared.language import INSTRUCTION_KEY, encode_instructions, instruction_space
from cleanrl_embodied.shared.tensordict_helpers import PRIVILEGED_KEY

CONTROL_DT = 0.05  # seconds per control step (20 Hz)
JOINT_DELTA_SCALE = 0.1  # default radians per control step at action magnitude 1 (action_mode="joint_delta")
EE_DELTA_SCALE = 0.05  # default metres of TCP motion per control step at action 1 (action_mode="ee_delta_pos")
MAX_LIFT = 0.1  # largest joint correction (rad) per step that keeps the TCP on its support (arm_limits=False)
TCP_RADIUS = 0.01  # metres
REST_QPOS_NOISE = 0.02  # half-width of the uniform noise added to the rest pose at reset (radians)
PUSH_POINT_MARGIN = 0.005  # the reward's push point lies this far behind the TCP-cube contact
REACH_THRESHOLD = 0.01  # TCP within this distance of the push point counts as "reached"
ABOVE_CUBE_TOLERANCE = 1e-5  # slack when deciding that the TCP comes down onto the cube's top face
DLS_DAMPING = 0.01  # damping of the least-squares Jacobian inverse of action_mode="ee_delta_pos"
GRAVITY = 9.81  # m/s^2, for the sliding cube's friction
CUBE_FRICTION = 0.5  # default Coulomb friction coefficient cube-table (cube_dynamics="sliding")

CUBE_DYNAMICS = ("kinematic", "sliding")

ACTION_MODES = ("joint_delta", "joint_pos", "ee_delta_pos")

# Reward terms, in the order they are summed, with their default weights. Unweighted values:
#   reach   1 - tanh(5 d_push), d_push = TCP distance to the push point (0 on success steps)
#   place   1 - tanh(5 d_goal) while the TCP is at the push point, else 0 (0 on success steps)
#   success 1 when the cube centre is within goal_radius of the goal
#   time    -1 every step
#   action_rate      -|a_t - a_{t-1}|^2, the policy's clipped actions (a_{-1} = 0 at an episode's start)
#   action_magnitude -|a_t|^2
# The defaults give ManiSkill PushCube-v1's normalized dense reward minus 1: (reach + place) / 3 - 1, and 0
# on success.
DEFAULT_REWARD_WEIGHTS = {
    "reach": 1.0 / 3.0,
    "place": 1.0 / 3.0,
    "success": 1.0,
    "time": 1.0,
    "action_rate": 0.0,
    "action_magnitude": 0.0,
}

# Parameters that events randomize, with their smallest allowed value (a value or a (low, high) range).
RANDOMIZABLE = {"cube_half_size": 1e-3, "push_friction": 0.0, "obs_noise_std": 0.0, "action_noise_std": 0.0}

CAMERAS = ("top", "front", "side", "perspective")

# Language-conditioned tasks (``tasks``, PushCubeLangRL): name -> (direction from the cube's start to the goal in
# radians, seen from the robot, which stands at -x facing +x; the instruction the policy gets).
TASKS = {
    "forward": (0.0, "push the cube forward"),
    "left": (0.5 * math.pi, "push the cube to the left"),
    "back": (math.pi, "push the cube back"),
    "right": (-0.5 * math.pi, "push the cube to the right"),
    # the diagonals: tasks PushCubeLangRL does not draw unless ``tasks`` names them (e.g. a target task that a
    # policy pretrained on the others has not seen, examples/hf_vla/pretrain.py)
    "forward_left": (0.25 * math.pi, "push the cube forward and left"),
    "forward_right": (-0.25 * math.pi, "push the cube forward and right"),
    "back_left": (0.75 * math.pi, "push the cube back and left"),
    "back_right": (-0.75 * math.pi, "push the cube back and right"),
}
LANG_TASKS = ("forward", "left", "back", "right")  # PushCubeLangRL's default
# Paraphrases of each task's instruction that no training run shows the policy (``instructions="heldout"``): the
# generalisation test of a language-conditioned policy. Per task, from near to far: another verb; another verb and
# noun, without "to the"; another verb, noun and a direction word the training instructions never use.
HELDOUT_INSTRUCTIONS = {
    "forward": ("move the cube forward", "shove the block forward", "slide the box ahead"),
    "left": ("move the cube to the left", "shove the block left", "slide the box leftward"),
    "back": ("move the cube back", "shove the block back", "slide the box backward"),
    "right": ("move the cube to the right", "shove the block right", "slide the box rightward"),
    "forward_left": ("move the cube forward and left", "shove the block forward left", "slide the box ahead leftward"),
    "forward_right": ("move the cube forward and right", "shove the block forward right",
                      "slide the box ahead rightward"),
    "back_left": ("move the cube back and left", "shove the block back left", "slide the box backward leftward"),
    "back_right": ("move the cube back and right", "shove the block back right", "slide the box backward rightward"),
}  # fmt: skip
INSTRUCTION_SETS = ("train", "heldout")
DEFAULT_INSTRUCTION_LENGTH = 32  # bytes of instruction tokens in the observation

# The constructor options that define what a policy sees (the observation's layout and frame) and what its actions
# mean. A checkpoint is resumed or evaluated only with the same values; the other options (dynamics, randomization,
# noise, rewards, episode ends, goals, render()'s camera) may change (shared/checkpoints.py).
INTERFACE_KWARGS = ("obs_mode", "action_mode", "joint_delta_scale", "ee_delta_scale", "image_size", "obs_cameras",
                    "cube_dynamics", "base_pos", "tasks", "instruction_length", "view_tasks",
                    "dropout_sensor")  # fmt: skip

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
# cube_dynamics="sliding" adds the cube's velocity (world xy, m/s): the cube moves on its own after a push.
SLIDING_OBS_LAYOUT = (*OBS_LAYOUT, ("object", "cube_vel", 2))

# Sensor dropout (``dropout_sensor``, see the class docstring): the sensors that can go missing, the state entries
# that "cube" zeroes (every one derived from the cube's pose), the flag entry that tells the policy a reading is
# missing, and the per-env state of the outages (saved by state_dict() when dropout is on).
DROPOUT_SENSORS = ("cube", "camera")
CUBE_ENTRIES = ("cube_pos", "cube_yaw_sincos", "tcp_to_cube", "cube_to_goal", "cube_vel")
SENSOR_MISSING_KEY = "sensor_missing"
DEFAULT_DROPOUT_RATE = 0.05
DEFAULT_DROPOUT_STEPS = (5, 20)
DROPOUT_STATE_KEYS = ("sensor_outage", "sensor_missing_steps")

# Per-env state tensors; state_dict() saves exactly these (plus the generator and the group size), and
# cube_vel with cube_dynamics="sliding".
STATE_KEYS = (
    "qpos", "qvel", "tcp_pos", "cube_xy", "cube_yaw", "goal_xy",
    "cube_half_size", "push_friction", "obs_noise_std", "action_noise_std", "prev_action", "elapsed_steps",
)  # fmt: skip
SLIDING_STATE_KEYS = (*STATE_KEYS, "cube_vel")

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
BACKGROUND_COLOR = (0.93, 0.94, 0.96)
# Perspective cameras for videos (eye, look-at point), world frame; the robot stands at -x, the goal lies at +x.
CAMERA_POSES = {
    "front": ((0.8, 0.0, 0.6), (-0.2, 0.0, 0.15)),  # facing the robot across the table
    "side": ((-0.15, -1.1, 0.55), (-0.15, 0.0, 0.15)),  # from the robot's right: the push runs left to right
    "perspective": ((0.6, -0.8, 0.8), (-0.2, 0.0, 0.1)),
}
CAMERA_FOV = math.radians(50.0)  # horizontal field of view

# Image observations (obs_mode "rgb", "proprio+rgb" and "state+rgb"): a top-down orthographic height-map camera
# over the part of the table where the cube, the goal and the pushing TCP can be (see the class docstring).
OBS_MODES = ("state", "dict", "rgb", "proprio+rgb", "state+rgb")
IMAGE_OBS_MODES = ("rgb", "proprio+rgb", "state+rgb")
PROPRIO_DIM = 17  # qpos, qvel, tcp_pos: the first entries of the state observation (OBS_LAYOUT)
DEFAULT_IMAGE_SIZE = 64
# The observation cameras (``obs_cameras``) and the observation entry each one fills: "top" looks down on the fixed
# region of the task, "wrist" looks down from the TCP and moves with it, WRIST_VIEW_WIDTH metres across its image.
OBS_CAMERA_KEYS = {"top": "rgb", "wrist": "wrist"}
DEFAULT_OBS_CAMERAS = ("top",)
WRIST_VIEW_WIDTH = 0.2
OBS_VIEW_MARGIN = 0.02  # metres of table shown beyond the farthest push point, cube corner and goal centre
OBS_TABLE_COLOR = (0.78, 0.78, 0.75)
OBS_GOAL_REGION_COLOR = (0.62, 0.86, 0.56)
OBS_GOAL_CENTRE_COLOR = (0.10, 0.50, 0.12)
OBS_CUBE_COLOR = (0.15, 0.35, 0.95)
OBS_TCP_LOW_COLOR = (1.0, 0.10, 0.10)  # the TCP at the table (red) ...
OBS_TCP_HIGH_COLOR = (1.0, 0.95, 0.10)  # ... and OBS_TCP_TOP_HEIGHT above it or higher (yellow), linear between
OBS_TCP_TOP_HEIGHT = 0.25
OBS_TCP_LEVELS = 32  # TCP colours (height quantized to 0.25 m / 31 = 8 mm)
OBS_LINK_LEVELS = 8  # grey levels of the arm links (by height, 0.15 dark at the table to 0.75 at 0.8 m)
OBS_LINK_ALPHA = 0.6  # links are see-through
OBS_SHADOW_FACTOR = 0.55  # brightness of surfaces in the TCP's shadow
OBS_SHADOW_SLOPE = 0.5  # the shadow lies this many metres toward -y per metre of TCP height above the surface
# Materials of the height map, drawn where their height is above what is there (ties: the higher index wins).
MAT_TABLE, MAT_GOAL_REGION, MAT_GOAL_CENTRE, MAT_CUBE, MAT_TCP = 0, 1, 2, 3, 4  # MAT_TCP + level: the TCP
NUM_MATERIALS = MAT_TCP + OBS_TCP_LEVELS
MATERIAL_BITS = 6  # a height-map key is (height in 0.1 mm) << MATERIAL_BITS | material
HEIGHT_QUANTUM = 1e-4
TOP_KEY_HEIGHT = (1 << (31 - MATERIAL_BITS)) - 1  # the TCP is drawn above everything
# Arm links drawn (pairs of forward_kinematics points; the others have length 0): upper arm, elbow, forearm,
# wrist, hand.
LINK_POINTS = ((2, 3), (3, 4), (4, 5), (6, 7), (7, 8))


@dataclass
class _ObsView:
    """One observation camera: its observation entry, square pixels, window and the tiles of what it draws."""

    key: str
    pixel: float  # metres per pixel
    x0: float  # world x of the window's left edge ...
    y1: float  # ... and y of its top edge; relative to the TCP where the view follows it
    follows_tcp: bool
    goal_centre_radius: float
    tcp_disk_radius: float
    tiles: dict[str, torch.Tensor]  # pixel offsets [k] of each primitive's tile
    links: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # link start and end points, fractions along


class PushCubeRLVecEnv(gym.vector.VectorEnv):
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
        self.joint_lower, self.joint_upper = franka.joint_limits(self.device)
        velocity_limit, acceleration_limit = franka.motion_limits(self.device)
        self._max_joint_step = velocity_limit * CONTROL_DT  # rad per control step
        self._max_joint_step_change = acceleration_limit * CONTROL_DT * CONTROL_DT  # rad per step, per step
        self.rest_qpos = franka.rest_qpos(self.device)
        # The joint limits and motion limits as full [N, 7] tensors (see _limit_joint_step).
        full_joints = lambda row: row.expand(self.num_envs, franka.NUM_JOINTS).contiguous()  # noqa: E731
        self._joint_lower_full, self._joint_upper_full = full_joints(self.joint_lower), full_joints(self.joint_upper)
        self._joint_range_full = full_joints(self.joint_upper - self.joint_lower)
        self._limits_full = {
            "change": full_joints(self._max_joint_step_change),
            "twice_change": full_joints(2.0 * self._max_joint_step_change),
            "half_change": full_joints(0.5 * self._max_joint_step_change),
            "max_step": full_joints(self._max_joint_step),
            "neg_max_step": full_joints(-self._max_joint_step),
            "zero": full_joints(torch.zeros(franka.NUM_JOINTS, device=self.device)),
            "one": full_joints(torch.ones(franka.NUM_JOINTS, device=self.device)),
            "tiny": full_joints(torch.full((franka.NUM_JOINTS,), 1e-12, device=self.device)),
        }
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
        self._substep_fractions = torch.tensor(
            [k / contact_substeps for k in range(1, contact_substeps + 1)], device=self.device
        ).view(-1, 1, 1)
        full = lambda value, rows=None: torch.full(  # noqa: E731  (constants of _resolve_contacts, full size)
            (self.num_envs,) if rows is None else (rows, self.num_envs), value, device=self.device
        )
        self._contact_constants = (full(1.0), full(0.0), full(1e-12), full(TCP_RADIUS), full(0.5), full(0.0, 2),
                                   full(1.0, 2))  # fmt: skip
        self._sign_plus_minus = torch.tensor([1.0, -1.0], device=self.device).view(2, 1)  # [cy, -cx] from [cy, cx]
        self._u_face_offset = torch.tensor([1.0, 0.0], device=self.device).view(2, 1)
        self._sign_minus_plus = torch.tensor([-1.0, 1.0], device=self.device).view(2, 1)
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

    def _joint_step_command(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The joint displacement [N, 7] the controller aims at in this control step, before the limits, and
        the TCP Jacobian at the current pose, joint-major [3, 7, N], when the action mode needed it (else None)."""
        if self.action_mode == "joint_delta":
            return self.joint_delta_scale * actions, None
        if self.action_mode == "joint_pos":
            target = self._joint_lower_full + 0.5 * (actions + 1.0) * self._joint_range_full
            return target - self.qpos, None
        _, jacobian = franka.tcp_position_and_jacobian_rows(self.qpos.T.contiguous(), self.base_pos)
        step = franka.damped_least_squares_rows(jacobian, self.ee_delta_scale * actions.T, DLS_DAMPING)
        return step.T.contiguous(), jacobian

    def _stoppable(self, distance: torch.Tensor) -> torch.Tensor:
        """The largest step s (rad per control step) after which a joint can still stop within ``distance`` d,
        slowing by at most A = a_max dt^2 per step. The steps s, s - A, s - 2A, ... sum to at most
        (s + A/2)^2 / (2A), so s = sqrt(2 A d) - A/2 is safe; so is s = d when d <= A (stop after this step)."""
        limits = self._limits_full
        distance = torch.maximum(distance, limits["zero"])
        root = torch.sqrt(limits["twice_change"] * distance) - limits["half_change"]
        return torch.maximum(root, torch.minimum(distance, limits["change"]))

    def _limit_joint_step(self, step: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The joint displacement [N, 7] of this control step under the Panda's velocity and acceleration
        limits, for a commanded displacement ``step`` (the arm holds one velocity over the step), the
        slowest displacement those limits allow (the one the TCP speed cap may fall back to), and the bounds
        ``(low, high)`` [N, 7] every displacement of this step must keep (the limits, and braking before the
        joint limits as in 1.), which contain both.

        1. Stoppable: a joint that must be able to stop at the step's target, or before its position limit
           if nearer (distance ``d``), with deceleration ``a_max`` moves at most ~``sqrt(2 a_max d)``, so a
           target is approached without overshoot (absolute-position targets settle instead of oscillating)
           and a joint brakes before its limit instead of hitting it.
        2. Acceleration: the velocity changes by at most ``a_max * dt`` from the previous step's.
        3. Velocity: at most ``v_max``.

        (Every constant is a full [N, 7] tensor, so that each op runs over one flat array: broadcasting a [7]
        row costs ~4x more on a CPU. Where step >= 0 is chosen by a lerp with weight min(sign(step) + 1, 1),
        exact and cheaper than a comparison and torch.where.)
        """
        limits, qpos = self._limits_full, self.qpos
        forward = torch.minimum(torch.sign(step) + limits["one"], limits["one"])  # 1 where step >= 0, else 0
        ahead = torch.lerp(qpos - self._joint_lower_full, self._joint_upper_full - qpos, forward)
        magnitude = step.abs()
        ratio = self._stoppable(torch.minimum(magnitude, ahead)) / torch.maximum(magnitude, limits["tiny"])
        step = step * torch.minimum(ratio, limits["one"])
        previous = self.qvel * CONTROL_DT
        low = torch.maximum(previous - limits["change"], limits["neg_max_step"])
        high = torch.minimum(previous + limits["change"], limits["max_step"])
        high = torch.maximum(high, low)  # a velocity above the limit (a loaded state) slows down at a_max
        step = torch.minimum(torch.maximum(step, low), high)
        slowest = torch.minimum(torch.maximum(low, limits["zero"]), high)
        # bounds that also brake before the joint limits (the commanded step already does, and slowest moves
        # toward a limit only when it can no longer brake in time anyway, as low or high then does)
        high = torch.minimum(torch.maximum(self._stoppable(self._joint_upper_full - qpos), low), high)
        low = torch.minimum(torch.maximum(-self._stoppable(qpos - self._joint_lower_full), low), high)
        high = torch.maximum(torch.maximum(high, step), slowest)
        low = torch.minimum(torch.minimum(low, step), slowest)
        return step, slowest, low, high

    def _cap_tcp_speed(self, step, slowest, tcp_target, jacobian) -> tuple[torch.Tensor, torch.Tensor]:
        """Shrink the joint step toward ``slowest`` (so the acceleration limit still holds) until the TCP moves
        at most ``max_tcp_speed * dt``; returns the step and the TCP target (rows x, y, z [3, N]), both to
        first order (``jacobian``: joint-major [3, 7, N]).

        The TCP displacement along ``slowest + s (step - slowest)`` is taken as linear in s, with the
        displacement of ``slowest`` predicted from the Jacobian at the step's target; s is the larger root of
        ``|u + s w| = v_max dt``, clamped to [0, 1] (0 when even the slowest step is too fast: the
        acceleration limit wins). The curvature of the arm's path leaves the TCP within ~1.5% of the cap.
        """
        limit = self.max_tcp_speed * CONTROL_DT
        tcp = self.tcp_pos.T
        full = tcp_target - tcp
        faster = step - slowest
        # full - (displacement of slowest), first order: J (step - slowest), summed over the joints
        w = franka.sum_joints((jacobian * faster.T.contiguous()).movedim(1, 0))
        u = full - w
        sum_xyz = lambda t: (t[0] + t[1]) + t[2]  # noqa: E731
        a = sum_xyz(w * w).clamp_min(1e-12)
        b = 2.0 * sum_xyz(u * w)
        c = sum_xyz(u * u) - limit * limit
        root = (-b + torch.sqrt((b * b - 4.0 * a * c).clamp_min(0.0))) / (2.0 * a)
        too_fast = sum_xyz(full * full) > limit * limit
        shrink = torch.where(too_fast, root.clamp(0.0, 1.0), 1.0)
        return slowest + shrink.unsqueeze(-1) * faster, tcp + u + shrink * w

    def _move_arm(self, actions: torch.Tensor) -> None:
        """Apply the joint step; a TCP that would sink below its support slides along it instead.

        The joint step is the action's command, limited (``_limit_joint_step``, with ``arm_limits``) and
        clipped to the joint limits.

        The support is the table, or the cube's top face when coming down onto it. A commanded
        configuration that puts the TCP below the support is corrected along the TCP height's gradient (the
        smallest joint change that lifts it back), so the vertical part of the motion is removed and the
        horizontal part kept (a frictionless surface). With ``arm_limits`` the correction is part of the limited
        step (``_lift_within_limits``: the velocity and acceleration limits hold at contact too, and the TCP
        brakes before a surface it comes down on), applied to the step and to the slowest one, and the TCP
        speed cap then picks a step between those two (``_cap_tcp_speed``). Without the limits it is one Newton
        step of at most ``MAX_LIFT`` per joint. The residual of the linear correction (and, with the limits, the
        part they cannot stop in time, under 1 cm) is clamped on the TCP position. (The gradient is taken at the
        target pose, or at the current pose in ee_delta_pos mode, which has that Jacobian.)

        Kinematics run joint-major (joint angles [7, N], positions as rows x, y, z [3, N], the Jacobian
        [3, 7, N]), where the per-joint ops are contiguous; the state keeps its [N, 7] and [N, 3] layout.
        """
        qpos_before = self.qpos
        step, jacobian = self._joint_step_command(actions)
        if self.arm_limits:
            step, slowest, low, high = self._limit_joint_step(step)  # both brake before the joint limits
        qpos_target = self._clip_to_limits(qpos_before + step)
        if jacobian is None:
            tcp_target, jacobian = franka.tcp_position_and_jacobian_rows(qpos_target.T.contiguous(), self.base_pos)
        else:  # ee_delta_pos: the Jacobian at the current pose serves the lift's Newton step too
            tcp_target = franka.tcp_position_rows(qpos_target.T.contiguous(), self.base_pos)
        min_z = self._support_height(self.tcp_pos, tcp_target) + TCP_RADIUS
        height_gradient = jacobian[2]  # [7, N]
        if self.arm_limits:  # the lift is part of the step, within the limits; then the TCP speed cap
            gradient = height_gradient.T.contiguous()
            lifted = self._lift_within_limits(step, low, high, gradient, tcp_target[2], min_z)
            slowest_z = tcp_target[2] + (gradient * (slowest - step)).sum(-1)  # first order
            slowest = self._lift_within_limits(slowest, low, high, gradient, slowest_z, min_z)
            tcp_target = tcp_target + franka.sum_joints((jacobian * (lifted - step).T.contiguous()).movedim(1, 0))
            step, _ = self._cap_tcp_speed(lifted, slowest, tcp_target, jacobian)  # between two lifted steps
            self.qpos = self._clip_to_limits(qpos_before + step)
        else:
            shortfall = (min_z - tcp_target[2]).clamp_min(0.0)
            gradient_sq = (height_gradient * height_gradient).sum(0).clamp_min(1e-6)
            lift = (height_gradient * (shortfall / gradient_sq)).clamp(-MAX_LIFT, MAX_LIFT)
            self.qpos = self._clip_to_limits(qpos_target + lift.T)
        tcp = franka.tcp_position_rows(self.qpos.T.contiguous(), self.base_pos)
        tcp[2] = torch.maximum(tcp[2], min_z)
        self.tcp_pos = tcp.T.contiguous()
        self.qvel = (self.qpos - qpos_before) / CONTROL_DT

    def _lift_within_limits(self, step, low, high, gradient, z_target, min_z) -> torch.Tensor:
        """The joint step [N, 7] nearest ``step`` along the TCP height's ``gradient`` [N, 7] (``step + lambda *
        gradient``, each joint clamped to ``[low, high]``, lambda >= 0 as small as it can be) that keeps the TCP
        (at height ``z_target`` [N] after ``step``, to first order) on its support at ``min_z`` [N], and, like a
        joint before its limit (``_stoppable``), able to stop before it: coming down, the TCP descends at most
        ``sqrt(2 C h) - C / 2`` per step at height ``h`` above the support, where ``C`` is half the height change
        per step that the joints' acceleration limits give along the gradient. The velocity and acceleration
        limits thus hold on every step, contact included (the lift used to be added after them).

        ``R(lambda) = sum_j g_j^2 min(lambda, lambda_j)`` is the rise bought with lambda (joint j saturates at
        ``lambda_j``, its room to its bound over |g_j|): concave and piecewise linear, so the smallest lambda with
        ``R >= needed`` is found exactly from R at the 7 breakpoints. Where even every joint at its bound falls
        short (a TCP too fast for a support that appears under it, e.g. the cube's top), the step rises as much
        as the limits allow, and the TCP position is then held on the support (``_move_arm``)."""
        limits, z_before = self._limits_full, self.tcp_pos[:, 2]
        height = (z_before - min_z).clamp_min(0.0)
        braking = 0.5 * (gradient.abs() * limits["change"]).sum(-1)  # C: m per step, per step
        descent = torch.maximum(torch.sqrt(2.0 * braking * height) - 0.5 * braking, torch.minimum(height, braking))
        needed = torch.maximum(z_before - descent, min_z) - z_target  # rise beyond the step's own, first order
        up = torch.minimum(torch.sign(gradient) + limits["one"], limits["one"])  # 1 where gradient >= 0, else 0
        room = torch.lerp(step - low, high - step, up)  # along +gradient, per joint
        weight = gradient * gradient
        saturates = room / torch.maximum(gradient.abs(), limits["tiny"])  # lambda_j
        rise_at = (weight.unsqueeze(1) * torch.minimum(saturates.unsqueeze(2), saturates.unsqueeze(1))).sum(-1)
        start = torch.where(rise_at < needed.unsqueeze(-1), saturates, 0.0).amax(-1)  # last breakpoint short of it
        rise = (weight * torch.minimum(start.unsqueeze(-1), saturates)).sum(-1)
        slope = torch.where(saturates > start.unsqueeze(-1), weight, 0.0).sum(-1)
        lam = (start + (needed - rise) / slope.clamp_min(1e-12)).clamp_min(0.0)
        return torch.minimum(torch.maximum(step + lam.unsqueeze(-1) * gradient, low), high)

    def _clip_to_limits(self, qpos: torch.Tensor) -> torch.Tensor:
        """Joint positions [N, 7] clipped to the Panda's limits."""
        return torch.minimum(torch.maximum(qpos, self._joint_lower_full), self._joint_upper_full)

    def _support_height(self, tcp_before: torch.Tensor, tcp_target: torch.Tensor) -> torch.Tensor:
        """Height of the surface under the TCP's target (rows x, y, z [3, N]) [N]: the cube's top when the TCP
        comes from above the cube (``tcp_before`` [N, 3]) and ends over its square, else the table (0)."""
        cos_yaw, sin_yaw = torch.cos(self.cube_yaw), torch.sin(self.cube_yaw)
        u, v = self._to_cube_frame(tcp_target[0], tcp_target[1], cos_yaw, sin_yaw)
        half = self.cube_half_size
        over_cube = (u.abs() <= half) & (v.abs() <= half)
        came_from_above = tcp_before[:, 2] - TCP_RADIUS >= 2 * half - ABOVE_CUBE_TOLERANCE
        return torch.where(over_cube & came_from_above, 2 * half, torch.zeros_like(half))

    def _to_cube_frame(self, x: torch.Tensor, y: torch.Tensor, cos_yaw: torch.Tensor, sin_yaw: torch.Tensor):
        """World xy points [N] expressed in each cube's frame (origin at its centre, axes along its faces)."""
        dx, dy = x - self.cube_xy[:, 0], y - self.cube_xy[:, 1]
        return cos_yaw * dx + sin_yaw * dy, cos_yaw * dy - sin_yaw * dx

    def _resolve_contacts(self, tcp_before: torch.Tensor, tcp_after: torch.Tensor) -> None:
        """Push each cube out of the TCP sphere moving from ``tcp_before`` to ``tcp_after`` [N, 3], in
        ``contact_substeps`` straight sub-steps (points ``lerp(tcp_before, tcp_after, k / K)``), each resolving
        contact against the cube as the previous sub-steps left it.

        Works in the cube frame (2-D). If the TCP centre is outside the square, the contact point is
        the square's closest point and the normal points from it to the TCP. If the centre got
        inside (a fast approach), the contact is on the face it entered through, taken from where the
        previous sub-step point lay, and the normal is that face's; so even a sub-step that carries
        the centre past the cube's middle pushes the cube forward instead of tunnelling (only a
        sub-step longer than the cube plus the sphere could). The cube moves by
        ``-normal * penetration`` and turns by
        ``push_friction * (contact x displacement) / (rho^2 + |contact|^2)``, with rho^2 = side^2 / 6
        (the square's radius of gyration), so a push through the centre never turns it.

        With ``cube_dynamics="sliding"`` the cube first slides for the sub-step's time (``_slide``), so that it
        cannot slide through the TCP either, and a push also sets the cube's velocity along the contact normal
        to the TCP's where the TCP closes in faster (the TCP moves at constant velocity over the control step):
        ``v -= max((v - v_tcp) . n, 0) n`` (a perfectly inelastic hit by the far heavier arm; the tangential
        velocity is kept, the TCP-cube contact being frictionless).

        Speed: a sub-step costs ~60 tensor ops on [N] or [2, N] (u and v, or x and y, side by side), so at
        thousands of envs on a CPU the op count, not the arithmetic, sets the time. Choices are made with float
        arithmetic instead of boolean masks (``sign`` for tests, ``lerp`` with 0/1 weights to select, exact for
        finite values), which are several times cheaper than comparisons and ``torch.where`` on a CPU; every
        value is computed with the same float operations in the same order as the plain formulas above, so
        the results are the same bit for bit.
        """
        num, substeps = self.num_envs, self.contact_substeps
        before, after = tcp_before.T, tcp_after.T  # [3, N]
        path = torch.empty(substeps + 1, 3, num, device=self.device)  # the sub-step points, row 0 the start
        path[0] = before
        path[1:] = torch.lerp(before.unsqueeze(0), after.unsqueeze(0), self._substep_fractions)
        points = path[:, :2]  # [x, y] ...
        points_perp = torch.stack((path[:, 1], -path[:, 0]), 1)  # ... and [y, -x] (turned by -90 degrees)
        half = self.cube_half_size
        # 0 where the TCP is low enough to touch the cube, -inf where it passes above: push = max(pen + bias, 0).
        bias = torch.where(path[1:, 2] - TCP_RADIUS < 2 * half, 0.0, -math.inf)
        half2, neg_half2 = half.expand(2, num), (-half).expand(2, num)
        gyration = 2.0 / 3.0 * half * half
        one, zero, tiny, radius, one_half, zero2, one2 = self._contact_constants
        sign_plus_minus = self._sign_plus_minus
        centre = self.cube_xy.T.contiguous()  # [2, N], updated in place
        yaw = self.cube_yaw.clone()
        if self._sliding:
            velocity = self.cube_vel.T.contiguous()  # [2, N], updated in place
            tcp_velocity = (after[:2] - before[:2]) / CONTROL_DT
        for k in range(substeps):
            if self._sliding:  # the cube slides for the sub-step, then the TCP's sub-step point pushes it
                self._slide(centre, velocity, CONTROL_DT / substeps)
            cos_yaw, sin_yaw = torch.cos(yaw), torch.sin(yaw)
            centre_perp = centre.flip(0) * sign_plus_minus  # [cy, -cx]
            # (u, v) = (c dx + s dy, c dy - s dx) of the previous and the current sub-step point: [2, 2, N]
            local = cos_yaw * (points[k : k + 2] - centre) + sin_yaw * (points_perp[k : k + 2] - centre_perp)
            prev, cur = local.unbind(0)
            # Centre outside the square: closest point and outward normal.
            closest = torch.clamp(cur, neg_half2, half2)
            off = cur - closest
            off_sq_u, off_sq_v = (off * off).unbind(0)
            gap = torch.sqrt(off_sq_u + off_sq_v)
            outside = torch.sign(gap)  # 1 outside the square, 0 inside
            inside = one - outside
            normal_out = off * torch.reciprocal(torch.maximum(gap, tiny))
            # Centre inside: the face it came through, [u face, v face] as 1/0 (u when |u_prev| >= |v_prev|) ...
            abs_u, abs_v = prev.abs().unbind(0)
            face = torch.clamp(torch.sign(abs_u - abs_v) * sign_plus_minus + self._u_face_offset, zero2, one2)
            prev_u, prev_v = (face * prev).unbind(0)
            face_sign = torch.sign(torch.sign(prev_u + prev_v) + one_half)  # ... and its side: 1 if >= 0, else -1
            normal_in = face * face_sign
            across_u, across_v = (normal_in * cur).unbind(0)
            depth = half - (across_u + across_v)

            normal = torch.lerp(normal_in, normal_out, outside)
            contact = torch.lerp(closest, face_sign * half, face * inside)
            penetration = (radius - gap) + depth * inside
            push = torch.maximum(penetration + bias[k], zero)
            moved = normal * push  # the cube moves by -moved (cube frame)
            moved_u, moved_v = moved.unbind(0)
            contact_u, contact_v = contact.unbind(0)
            torque = contact_v * moved_u - contact_u * moved_v  # contact x (-moved)
            lever_u, lever_v = (contact * contact).unbind(0)
            yaw += self.push_friction * torque / (gyration + (lever_u + lever_v))
            moved_perp = moved.flip(0) * self._sign_minus_plus  # [-moved_v, moved_u]
            centre -= cos_yaw * moved + sin_yaw * moved_perp  # the world-frame displacement
            if self._sliding:
                normal_world = cos_yaw * normal + sin_yaw * (normal.flip(0) * self._sign_minus_plus)
                closing_u, closing_v = ((velocity - tcp_velocity) * normal_world).unbind(0)
                closing = torch.maximum(closing_u + closing_v, zero) * torch.sign(push)  # 0 without contact
                velocity -= closing * normal_world
        self.cube_xy = centre.T.contiguous()
        self.cube_yaw = yaw
        if self._sliding:
            self.cube_vel = velocity.T.contiguous()

    def _slide(self, centre: torch.Tensor, velocity: torch.Tensor, duration: float) -> None:
        """cube_dynamics="sliding": free sliding for ``duration`` seconds, in place on the cube centres and
        velocities ([2, N], world x and y). The cube moves along its velocity and slows down by mu g (Coulomb
        friction with the table) until it stops: by the mean speed times the duration while it keeps sliding,
        else by v^2 / (2 mu g) to where it stops, so that a cube left at speed v slides exactly v^2 / (2 mu g)
        however the time is cut."""
        velocity_x, velocity_y = velocity.unbind(0)
        speed = torch.sqrt(velocity_x * velocity_x + velocity_y * velocity_y)
        deceleration = self.cube_friction * GRAVITY
        slowdown = deceleration * duration  # speed lost while still sliding
        new_speed = (speed - slowdown).clamp_min(0.0)
        distance = torch.where(speed > slowdown, 0.5 * duration * (speed + new_speed),
                               speed * speed / (2.0 * deceleration))  # fmt: skip
        direction = velocity / speed.clamp_min(1e-12)
        centre += direction * distance
        velocity.copy_(direction * new_speed)

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

    # ------------------------------------------------------------------ rendering
    def render(self, env_index: int = 0, height: int = 256, width: int = 256) -> np.ndarray:
        """Top-down RGB image (uint8 [height, width, 3]) of one env, drawn with tensor ops.

        Shows the table, the goal region (green disk, red centre), the cube (rotated blue square),
        the robot base, the arm links (grey, lighter when higher) and the TCP (disk, dark when low
        and yellow when high). x points right, y points up. With ``camera`` other than "top" the same
        scene is seen through a perspective camera (``_render_camera``).
        """
        if self.camera != "top":
            return self._render_camera(env_index, height, width)
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

    def _render_camera(self, env_index: int, height: int, width: int) -> np.ndarray:
        """The scene through the perspective camera ``CAMERA_POSES[self.camera]``, drawn far to near (painter's
        order): table, goal disk, the cube's visible faces, base, arm links and TCP by depth."""
        eye, target = (torch.tensor(v, dtype=torch.float32) for v in CAMERA_POSES[self.camera])
        project = _camera(eye, target, height, width)
        py, px = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
        image = torch.empty(height, width, 3)
        image[:] = image.new_tensor(BACKGROUND_COLOR)
        x0, x1, y0, y1 = *RENDER_X_RANGE, *RENDER_Y_RANGE
        table = torch.tensor([[x0, y0, 0.0], [x1, y0, 0.0], [x1, y1, 0.0], [x0, y1, 0.0]])
        _paint(image, _convex_polygon(px, py, *project(table)[:2]), TABLE_COLOR)
        angles = torch.linspace(0, 2 * math.pi, 33)[:-1]
        goal = self.goal_xy[env_index].cpu()
        for radius, color in ((self.goal_radius, GOAL_REGION_COLOR), (0.012, GOAL_CENTRE_COLOR)):
            ring = torch.stack((goal[0] + radius * torch.cos(angles), goal[1] + radius * torch.sin(angles),
                                torch.full_like(angles, 1e-3)), -1)  # fmt: skip
            _paint(image, _convex_polygon(px, py, *project(ring)[:2]), color, alpha=0.6 if radius > 0.02 else 1.0)

        items = []  # (depth, draw function) of everything above the table
        half, yaw = float(self.cube_half_size[env_index]), float(self.cube_yaw[env_index])
        centre = torch.tensor([*self.cube_xy[env_index].tolist(), half])
        axes = torch.tensor([[math.cos(yaw), math.sin(yaw), 0.0], [-math.sin(yaw), math.cos(yaw), 0.0],
                             [0.0, 0.0, 1.0]])  # fmt: skip
        for axis in range(3):
            for sign in (-1.0, 1.0):
                normal = sign * axes[axis]
                if float((eye - (centre + half * normal)) @ normal) <= 0:
                    continue  # faces away from the camera
                u, v = axes[(axis + 1) % 3], axes[(axis + 2) % 3]
                corners = torch.stack([centre + half * (normal + a * u + b * v)
                                       for a, b in ((-1, -1), (1, -1), (1, 1), (-1, 1))])  # fmt: skip
                shade = 0.75 + 0.25 * float(normal[2] > 0.5)  # the top face lighter
                color = tuple(shade * c for c in CUBE_COLOR)
                mask = _convex_polygon(px, py, *project(corners)[:2])
                items.append((float(project(corners)[2].mean()), lambda m=mask, c=color: _paint(image, m, c)))
        points = franka.forward_kinematics(self.qpos[env_index : env_index + 1].cpu(), self.base_pos)[0]
        u, v, depth = project(points)
        focal = 0.5 * width / math.tan(0.5 * CAMERA_FOV)
        items.append((float(depth[0]), lambda: _paint(image, _disk(px, py, (u[0], v[0]), 0.06 * focal / depth[0]),
                                                      BASE_COLOR)))  # fmt: skip
        for i in range(len(points) - 1):
            shade = 0.35 + 0.5 * float(((points[i, 2] + points[i + 1, 2]) / 2).clamp(0.0, 0.8) / 0.8)
            half_width = float(LINK_HALF_WIDTH * focal / ((depth[i] + depth[i + 1]) / 2))
            mask = _segment(px, py, (u[i], v[i]), (u[i + 1], v[i + 1]), max(half_width, 1.0))
            items.append((float((depth[i] + depth[i + 1]) / 2),
                          lambda m=mask, c=(shade, shade, shade): _paint(image, m, c, alpha=0.8)))  # fmt: skip
        tcp_radius = max(TCP_RADIUS * focal / float(depth[-1]), 2.0)
        items.append((float(depth[-1]) - 1e-3,
                      lambda: _paint(image, _disk(px, py, (u[-1], v[-1]), tcp_radius), (0.95, 0.85, 0.1))))  # fmt: skip
        for _, draw in sorted(items, key=lambda item: -item[0]):
            draw()
        return (image * 255).round().to(torch.uint8).numpy()

    # ------------------------------------------------------------------ image observations
    def _setup_obs_camera(self, goal_directions: list[float]) -> None:
        """The views of the observation cameras (``obs_cameras``, see the class docstring) and their colour table.
        The top view's window holds the region of every goal direction (of every task); the wrist view's is
        ``WRIST_VIEW_WIDTH`` wide around the TCP."""
        height, width = self.image_size
        views = {}
        if "top" in self.obs_cameras:
            half_max = self.param_ranges["cube_half_size"][1]
            reach = max(math.sqrt(2.0) * half_max, half_max + 2 * TCP_RADIUS + PUSH_POINT_MARGIN) + OBS_VIEW_MARGIN
            regions = []  # (centre, half-widths) of the region of each goal direction
            for direction in goal_directions:
                centre = tuple(0.5 * self.goal_distance * f(direction) for f in (math.cos, math.sin))
                regions.append((centre, tuple(self.cube_xy_range + abs(c) + reach for c in centre)))
            if len(regions) == 1:
                centre, (extent_x, extent_y) = regions[0]
            else:  # the bounding box of them all
                lows = [min(c[i] - e[i] for c, e in regions) for i in (0, 1)]
                highs = [max(c[i] + e[i] for c, e in regions) for i in (0, 1)]
                centre = tuple(0.5 * (lo + hi) for lo, hi in zip(lows, highs))
                extent_x, extent_y = (0.5 * (hi - lo) for lo, hi in zip(lows, highs))
            pixel = max(2 * extent_x / width, 2 * extent_y / height)  # square pixels, the region fits both ways
            x0, y1 = centre[0] - 0.5 * width * pixel, centre[1] + 0.5 * height * pixel  # left and top edges
            views["top"] = self._obs_view("top", pixel, x0, y1, follows_tcp=False, links=True)
        if "wrist" in self.obs_cameras:  # edges relative to the TCP: it sits at the image's centre
            pixel = WRIST_VIEW_WIDTH / width
            views["wrist"] = self._obs_view("wrist", pixel, -0.5 * width * pixel, 0.5 * height * pixel,
                                            follows_tcp=True, links=False)  # fmt: skip
        self._obs_views = [views[camera] for camera in self.obs_cameras]
        self._image_start = (torch.arange(self.num_envs, device=self.device) * height * width).view(-1, 1, 1, 1)
        self._image_cols = torch.arange(width, device=self.device).view(1, 1, 1, width)  # the whole-image tile
        self._image_rows = torch.arange(height, device=self.device).view(1, 1, height, 1)
        self._palette = self._obs_palette().to(self.device)

    def _obs_view(self, camera: str, pixel: float, x0: float, y1: float, follows_tcp: bool, links: bool) -> _ObsView:
        """A view of ``pixel`` metres per pixel with its window's left and top edges at world x0 and y1 (relative to
        the TCP where it ``follows_tcp``): the radii and the pixel tiles of what it draws, and the points along the
        arm links (``links``) spaced one pixel apart."""
        half_max, (height, width) = self.param_ranges["cube_half_size"][1], self.image_size
        goal_centre_radius, tcp_disk_radius = max(0.012, 2.0 * pixel), max(TCP_RADIUS, 2.0 * pixel)

        def tile(radius: float) -> torch.Tensor | None:
            """Pixel offsets of a disk's tile; None where the tile would hold as many pixels as the whole image (the
            goal region in the wrist view), which is then drawn in place (see ``_tiles``)."""
            # A disk of radius r around a point in column c covers columns c - floor(r + 1/2) .. c + floor(r + 1/2).
            reach = math.floor(radius / pixel + 0.5)
            if (2 * reach + 1) ** 2 >= height * width:
                return None
            return torch.arange(-reach, reach + 1, device=self.device)

        tiles = {
            "goal_region": tile(self.goal_radius),
            "goal_centre": tile(goal_centre_radius),
            "cube": tile(math.sqrt(2.0) * half_max),
            "tcp": tile(tcp_disk_radius),
            "shadow": tile(tcp_disk_radius + OBS_SHADOW_SLOPE * 2 * half_max),
        }
        link_points = None
        if links:
            # The links: points spaced one pixel along each link, each drawn as the 2 x 2 pixels around it (a band
            # 2 pixels wide). The links' lengths are constant, so fixed fractions along them do.
            rest = franka.forward_kinematics(self.rest_qpos.unsqueeze(0).cpu(), self.base_pos)[0]
            fractions = [torch.linspace(0.0, 1.0, math.ceil(float((rest[b] - rest[a]).norm()) / pixel) + 1)
                         for a, b in LINK_POINTS]  # fmt: skip
            start = torch.tensor([a for (a, _), f in zip(LINK_POINTS, fractions) for _ in f], device=self.device)
            end = torch.tensor([b for (_, b), f in zip(LINK_POINTS, fractions) for _ in f], device=self.device)
            link_points = (start, end, torch.cat(fractions).to(self.device).view(1, -1, 1))
            tiles["link"] = torch.arange(2, device=self.device)
        return _ObsView(OBS_CAMERA_KEYS[camera], pixel, x0, y1, follows_tcp, goal_centre_radius, tcp_disk_radius,
                        tiles, link_points)  # fmt: skip

    def _obs_palette(self) -> torch.Tensor:
        """uint8 [3, NUM_MATERIALS * 2 * (OBS_LINK_LEVELS + 1)]: the colour of every (material, in shadow,
        link grey level or 0) combination, indexed by material + NUM_MATERIALS * (shadow + 2 * link level)."""
        base = [OBS_TABLE_COLOR, OBS_GOAL_REGION_COLOR, OBS_GOAL_CENTRE_COLOR, OBS_CUBE_COLOR]
        low, high = torch.tensor(OBS_TCP_LOW_COLOR), torch.tensor(OBS_TCP_HIGH_COLOR)
        levels = torch.linspace(0.0, 1.0, OBS_TCP_LEVELS).unsqueeze(-1)
        colors = torch.cat((torch.tensor(base), low + levels * (high - low)))  # [NUM_MATERIALS, 3]
        is_tcp = (torch.arange(NUM_MATERIALS) >= MAT_TCP).unsqueeze(-1)  # the TCP is on top of shadow and links
        table = []
        for link_level in range(OBS_LINK_LEVELS + 1):
            for shadow in (False, True):
                color = colors * OBS_SHADOW_FACTOR if shadow else colors
                if link_level:
                    grey = 0.15 + 0.6 * (link_level - 1) / (OBS_LINK_LEVELS - 1)
                    color = (1 - OBS_LINK_ALPHA) * color + OBS_LINK_ALPHA * grey
                table.append(torch.where(is_tcp, colors, color))
        return (torch.cat(table) * 255).round().to(torch.uint8).T.contiguous()

    def _tiles(self, window: tuple, x: torch.Tensor, y: torch.Tensor, offsets: torch.Tensor | None,
               shift: float = 0.0):  # fmt: skip
        """Pixels near the world points x, y [N, M] in ``window`` (pixel size, and the left and top edges: floats,
        or [N, 1] per env): rows and columns ``offsets`` away from the pixel holding the point moved by ``shift``
        pixels up and left. Returns the index of each pixel in the images of all envs, flattened (N * H * W, a
        spare slot, for pixels outside the image), [N, M, k, k], and world x [N, M, 1, k] and y [N, M, k, 1] of
        the pixel centres. ``offsets=None`` (M = 1): the whole image, index None (``_draw`` draws it in place)."""
        height, width = self.image_size
        pixel, x0, y1 = window
        if offsets is None:
            cols, rows = self._image_cols, self._image_rows
            if isinstance(x0, torch.Tensor):
                x0, y1 = x0[..., None, None], y1[..., None, None]
            return None, x0 + (cols + 0.5) * pixel, y1 - (rows + 0.5) * pixel
        col = torch.floor(((x - x0) / pixel - shift).clamp(-1e6, 1e6)).long()
        row = torch.floor(((y1 - y) / pixel - shift).clamp(-1e6, 1e6)).long()
        cols = col[..., None, None] + offsets  # [N, M, 1, k]
        rows = row[..., None, None] + offsets[:, None]  # [N, M, k, 1]
        inside = (cols >= 0) & (cols < width) & (rows >= 0) & (rows < height)
        flat = torch.where(inside, self._image_start + rows * width + cols, self.num_envs * height * width)
        if isinstance(x0, torch.Tensor):  # [N, 1] -> [N, 1, 1, 1], against the tiles
            x0, y1 = x0[..., None, None], y1[..., None, None]
        return flat, x0 + (cols + 0.5) * pixel, y1 - (rows + 0.5) * pixel

    def _draw(self, buffer: torch.Tensor, flat: torch.Tensor | None, mask: torch.Tensor | None, value,
              reduce: str = "amax"):  # fmt: skip
        """buffer[pixel] = max(buffer[pixel], value) (or + value, ``reduce="sum"``) where ``mask`` (tile shape;
        value broadcasts to it; None: the whole tile); pixels outside the mask go to the spare slot (the last).
        ``flat=None``: the tile is the whole image (``_tiles``), drawn in place without a scatter."""
        if flat is None:
            image = buffer[:-1].view(self.num_envs, 1, *self.image_size)
            value = mask.to(buffer.dtype) * value  # 0 (the table) outside the mask changes nothing
            torch.maximum(image, value, out=image) if reduce == "amax" else image.add_(value)
            return
        if mask is not None:
            flat = torch.where(mask, flat, buffer.shape[0] - 1)
        if isinstance(value, torch.Tensor):
            value = value.to(buffer.dtype).expand(flat.shape)
        else:  # a Python number: filled on the device (as_tensor would copy it from the host, a sync on a GPU)
            value = torch.full(flat.shape, value, dtype=buffer.dtype, device=buffer.device)
        buffer.scatter_reduce_(0, flat.reshape(-1), value.reshape(-1), reduce)

    def _render_images(self) -> dict[str, torch.Tensor]:
        """{observation entry: uint8 [N, 3, H, W]} of the current state through every observation camera, all envs
        at once with tensor ops on the env's device (no host sync). See the class docstring for what is drawn."""
        num = self.num_envs
        col = lambda t: t.view(num, 1, 1, 1)  # noqa: E731  ([N] -> broadcasts against tiles [N, 1, k, k])
        tcp_x, tcp_y, tcp_z = self.tcp_pos[:, 0], self.tcp_pos[:, 1], self.tcp_pos[:, 2]
        level = ((tcp_z - TCP_RADIUS) / (OBS_TCP_TOP_HEIGHT - TCP_RADIUS)).clamp(0.0, 1.0) * (OBS_TCP_LEVELS - 1)
        half = col(self.cube_half_size)
        scene = {  # what every view draws, computed once
            "col": col,
            "tcp": (tcp_x, tcp_y, tcp_z),
            "tcp_key": col((TOP_KEY_HEIGHT << MATERIAL_BITS) | (MAT_TCP + torch.floor(level + 0.5).to(torch.int32))),
            "cube_yaw": (col(torch.cos(self.cube_yaw)), col(torch.sin(self.cube_yaw))),
            "cube_half": half,
            "cube_key": (torch.floor(2 * half / HEIGHT_QUANTUM).to(torch.int32) << MATERIAL_BITS) | MAT_CUBE,
        }
        if any(view.links is not None for view in self._obs_views):
            scene["arm"] = franka.forward_kinematics(self.qpos, self.base_pos)  # [N, 9, 3]
        return {view.key: self._render_view(view, scene) for view in self._obs_views}

    def _render_view(self, view: _ObsView, scene: dict) -> torch.Tensor:
        """uint8 [N, 3, H, W] images through one observation camera (``scene``: see ``_render_images``)."""
        num, (height, width) = self.num_envs, self.image_size
        col = scene["col"]
        tcp_x, tcp_y, tcp_z = scene["tcp"]
        if view.follows_tcp:  # the window's edges, per env [N, 1]
            window = (view.pixel, self.tcp_pos[:, :1] + view.x0, self.tcp_pos[:, 1:2] + view.y1)
        else:
            window = (view.pixel, view.x0, view.y1)
        # Height map of all envs' images (flat): key = height << MATERIAL_BITS | material, the table (0)
        # everywhere, and one spare slot at the end.
        keys = torch.zeros(num * height * width + 1, dtype=torch.int32, device=self.device)
        goal_x, goal_y = self.goal_xy[:, :1], self.goal_xy[:, 1:]
        goal_disks = (
            (self.goal_radius, view.tiles["goal_region"], MAT_GOAL_REGION),
            (view.goal_centre_radius, view.tiles["goal_centre"], MAT_GOAL_CENTRE),
        )
        for radius, offsets, material in goal_disks if not self.task_names else ():  # tasks: only words tell
            flat, px, py = self._tiles(window, goal_x, goal_y, offsets)
            self._draw(keys, flat, (px - col(goal_x)) ** 2 + (py - col(goal_y)) ** 2 <= radius * radius, material)

        flat, px, py = self._tiles(window, self.cube_xy[:, :1], self.cube_xy[:, 1:], view.tiles["cube"])
        (cos_yaw, sin_yaw), half = scene["cube_yaw"], scene["cube_half"]
        dx, dy = px - col(self.cube_xy[:, 0]), py - col(self.cube_xy[:, 1])
        inside = ((cos_yaw * dx + sin_yaw * dy).abs() <= half) & ((cos_yaw * dy - sin_yaw * dx).abs() <= half)
        self._draw(keys, flat, inside, scene["cube_key"])

        flat, px, py = self._tiles(window, tcp_x.view(num, 1), tcp_y.view(num, 1), view.tiles["tcp"])
        inside = (px - col(tcp_x)) ** 2 + (py - col(tcp_y)) ** 2 <= view.tcp_disk_radius**2
        self._draw(keys, flat, inside, scene["tcp_key"])

        # Palette variant of each pixel, NUM_MATERIALS * (shadow + 2 * link grey level). Arm links first: points
        # along each link, per pixel the highest link's level (a height map of its own).
        variant = torch.zeros_like(keys)
        if view.links is not None:
            link_start, link_end, link_fraction = view.links
            start, end = scene["arm"][:, link_start], scene["arm"][:, link_end]
            along = start + link_fraction * (end - start)  # [N, M, 3]
            link_level = 1 + torch.floor((along[..., 2] / 0.8).clamp(0.0, 1.0) * (OBS_LINK_LEVELS - 1) + 0.5)
            flat, _, _ = self._tiles(window, along[..., 0], along[..., 1], view.tiles["link"], shift=0.5)
            self._draw(variant, flat, None, (2 * NUM_MATERIALS * link_level)[..., None, None])
        # The TCP's shadow on the table or the cube top: the disk around the TCP shifted toward -y by
        # OBS_SHADOW_SLOPE x (TCP height above the surface at that pixel), where the surface is below the TCP.
        flat, px, py = self._tiles(window, tcp_x.view(num, 1), (tcp_y - OBS_SHADOW_SLOPE * tcp_z).view(num, 1),
                                   view.tiles["shadow"])  # fmt: skip
        under = keys[flat] if flat is not None else keys[:-1].view(num, 1, height, width)
        above = col(tcp_z) - (under >> MATERIAL_BITS).float() * HEIGHT_QUANTUM
        inside = (above > 0) & ((under & ((1 << MATERIAL_BITS) - 1)) < MAT_TCP)
        inside &= (px - col(tcp_x)) ** 2 + (py - col(tcp_y) + OBS_SHADOW_SLOPE * above) ** 2 <= view.tcp_disk_radius**2
        self._draw(variant, flat, inside, NUM_MATERIALS, reduce="sum")  # each pixel of the tile once

        index = (keys[:-1] & ((1 << MATERIAL_BITS) - 1)).add_(variant[:-1])
        channels = [channel.index_select(0, index).view(num, height, width) for channel in self._palette]
        return torch.stack(channels, 1)

    def close(self) -> None:
        """Nothing to release."""


class PushCubeLangRLVecEnv(PushCubeRLVecEnv):
    """PushCubeLangRL: PushCubeRL with its four language-conditioned tasks, ``LANG_TASKS`` (unless ``tasks`` says
    otherwise); see ``PushCubeRLVecEnv``'s "Tasks"."""

    def __init__(self, *args, tasks: Sequence[str] | None = LANG_TASKS, **kwargs):
        super().__init__(*args, tasks=tasks, **kwargs)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_range(kwarg: str, value, minimum: float) -> tuple[float, float]:
    """A (low, high) pair of finite numbers with minimum <= low <= high (a list from JSON is fine)."""
    ok = (isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_number(v) and math.isfinite(v)
          for v in value) and minimum <= value[0] <= value[1])  # fmt: skip
    if not ok:
        raise ValueError(f"PushCubeRL: {kwarg} must be (low, high) with {minimum:g} <= low <= high, got {value!r}")
    return float(value[0]), float(value[1])


def _check_args(args: dict) -> dict[str, tuple[float, float]]:
    """Raise ValueError with one line naming the constructor argument and its allowed values; return the
    (low, high) range of every randomizable parameter (a point where it is not randomized)."""

    def fail(kwarg: str, allowed: str) -> None:
        raise ValueError(f"PushCubeRL: {kwarg} must be {allowed}, got {args[kwarg]!r}")

    number = lambda k: _is_number(args[k]) and math.isfinite(args[k])  # noqa: E731
    if not _is_int(args["num_envs"]) or args["num_envs"] < 1:
        fail("num_envs", "a positive integer")
    if not _is_int(args["max_episode_steps"]) or args["max_episode_steps"] < 1:
        fail("max_episode_steps", "an integer >= 1")
    if args["obs_mode"] not in OBS_MODES:
        fail("obs_mode", " or ".join(repr(m) for m in OBS_MODES))
    if not isinstance(args["privileged_state"], (bool, np.bool_)):
        fail("privileged_state", "true or false")
    if args["privileged_state"] and args["obs_mode"] not in IMAGE_OBS_MODES:
        modes = " or ".join(repr(m) for m in IMAGE_OBS_MODES)
        fail(
            "privileged_state", f"false with obs_mode {args['obs_mode']!r} (the state is observed); true needs {modes}"
        )
    size = args["image_size"]
    if not ((_is_int(size) and size >= 1) or (isinstance(size, (list, tuple)) and len(size) == 2
                                                and all(_is_int(v) and v >= 1 for v in size))):  # fmt: skip
        fail("image_size", "a positive integer or (height, width) of positive integers")
    cameras = args["obs_cameras"]
    allowed = [list(c) for c in (("top",), ("wrist",), ("top", "wrist"))]
    if not isinstance(cameras, (list, tuple)) or list(cameras) not in allowed:
        fail("obs_cameras", " or ".join(map(str, allowed)) + " (the cameras of the image observations)")
    if tuple(cameras) != DEFAULT_OBS_CAMERAS and args["obs_mode"] not in IMAGE_OBS_MODES:
        modes = " or ".join(repr(m) for m in IMAGE_OBS_MODES)
        default = list(DEFAULT_OBS_CAMERAS)
        fail("obs_cameras", f"{default} with obs_mode {args['obs_mode']!r} (no images); 'wrist' needs {modes}")
    sensor, mode = args["dropout_sensor"], args["obs_mode"]
    if sensor is not None and sensor not in DROPOUT_SENSORS:
        fail("dropout_sensor", "null (no dropout) or " + " or ".join(repr(s) for s in DROPOUT_SENSORS))
    if sensor == "camera" and mode not in IMAGE_OBS_MODES:
        modes = " or ".join(repr(m) for m in IMAGE_OBS_MODES)
        fail("dropout_sensor", f"null or 'cube' with obs_mode {mode!r} (no images); 'camera' needs {modes}")
    if sensor == "cube" and mode in ("rgb", "proprio+rgb"):
        fail("dropout_sensor", f"null or 'camera' with obs_mode {mode!r} (the cube is seen in the image only); "
                               "'cube' needs 'state', 'dict' or 'state+rgb'")  # fmt: skip
    if not number("dropout_rate") or not 0.0 <= args["dropout_rate"] <= 1.0:
        fail("dropout_rate", "a number in [0, 1] (the probability per env and step that a working sensor fails)")
    steps = args["dropout_steps"]
    if not (isinstance(steps, (list, tuple)) and len(steps) == 2 and all(_is_int(k) for k in steps)
            and 1 <= steps[0] <= steps[1]):  # fmt: skip
        fail("dropout_steps", "[min, max], integers with 1 <= min <= max (control steps an outage lasts)")
    if args["action_mode"] not in ACTION_MODES:
        fail("action_mode", " or ".join(repr(m) for m in ACTION_MODES))
    for kwarg in ("joint_delta_scale", "ee_delta_scale", "max_tcp_speed", "goal_radius", "cube_half_size"):
        if not number(kwarg) or args[kwarg] <= 0:
            fail(kwarg, "a number > 0")
    for kwarg in ("arm_limits", "terminate_on_success"):
        if not isinstance(args[kwarg], (bool, np.bool_)):
            fail(kwarg, "true or false")
    for kwarg in ("goal_direction",):
        if not number(kwarg):
            fail(kwarg, "a finite number (radians)")
    for kwarg in ("tasks", "view_tasks"):
        names = args[kwarg]
        if names is not None and (
            not isinstance(names, (list, tuple))
            or not names
            or not all(isinstance(t, str) and t in TASKS for t in names)
            or len(set(names)) != len(names)
        ):
            fail(kwarg, f"null or a list of distinct task names from {', '.join(TASKS)}")
    tasks = args["tasks"]
    if tasks is not None and args["goal_direction"] != 0.0:
        raise ValueError("PushCubeRL: give tasks or goal_direction, not both (each task has its own direction)")
    if args["instructions"] not in INSTRUCTION_SETS:
        fail("instructions", " or ".join(f'"{name}"' for name in INSTRUCTION_SETS))
    names = tasks or LANG_TASKS  # the instructions this env can show (its tasks', PushCubeLangRL's by default)
    texts = [TASKS[name][1] for name in names] + [t for name in names for t in HELDOUT_INSTRUCTIONS[name]]
    longest = max(len(text.encode()) for text in texts)
    if not _is_int(args["instruction_length"]) or args["instruction_length"] < longest:
        fail("instruction_length", f"an integer >= {longest} (bytes of the longest instruction)")
    if not number("goal_distance") or args["goal_distance"] <= args["goal_radius"]:
        fail(
            "goal_distance",
            f"a number > goal_radius ({args['goal_radius']!r}; else the cube starts in the goal "
            "and every episode succeeds at its first step)",
        )
    for kwarg in (
        "cube_xy_range",
        "cube_yaw_range",
        "push_friction",
        "obs_noise_std",
        "action_noise_std",
        "event_cube_shift_std",
    ):
        if not number(kwarg) or args[kwarg] < 0:
            fail(kwarg, "a number >= 0")
    if not _is_int(args["contact_substeps"]) or args["contact_substeps"] < 1:
        fail("contact_substeps", "an integer >= 1")
    if args["cube_dynamics"] not in CUBE_DYNAMICS:
        fail("cube_dynamics", " or ".join(repr(m) for m in CUBE_DYNAMICS))
    if not number("cube_friction") or args["cube_friction"] <= 0:
        fail("cube_friction", "a number > 0 (Coulomb friction coefficient of the cube on the table)")
    if not _is_int(args["randomize_every"]) or args["randomize_every"] < 0:
        fail("randomize_every", "an integer >= 0 (control steps between events; 0: no interval event)")
    at = args["randomize_at"]
    if not isinstance(at, (list, tuple)) or not all(_is_int(k) and k >= 1 for k in at):
        fail("randomize_at", "a list of integers >= 1 (episode steps after which the event fires)")
    base = args["base_pos"]
    if not isinstance(base, (list, tuple)) or len(base) != 3 or not all(_is_number(v) for v in base):
        fail("base_pos", "3 numbers (x, y, z)")
    if args["camera"] not in CAMERAS:
        fail("camera", " or ".join(repr(c) for c in CAMERAS))
    if args["render_mode"] not in (None, "rgb_array"):
        fail("render_mode", "None or 'rgb_array'")

    weights = args["reward_weights"]
    if weights is not None:
        if not isinstance(weights, Mapping):
            fail("reward_weights", f"a dict {{term: weight}} with terms {', '.join(DEFAULT_REWARD_WEIGHTS)}")
        for name, weight in weights.items():
            if name not in DEFAULT_REWARD_WEIGHTS:
                raise ValueError(
                    f"PushCubeRL: reward_weights has an unknown term {name!r}; terms: "
                    f"{', '.join(DEFAULT_REWARD_WEIGHTS)}"
                )
            if not _is_number(weight) or not math.isfinite(weight):
                raise ValueError(f"PushCubeRL: reward_weights[{name!r}] must be a finite number, got {weight!r}")

    ranges = {name: (float(args[name]), float(args[name])) for name in RANDOMIZABLE}
    if not isinstance(args["randomize"] or {}, Mapping):  # before dict() of it, which raises its own TypeError
        fail("randomize", f"a dict {{parameter: [low, high]}} with parameters {', '.join(RANDOMIZABLE)}")
    randomize = dict(args["randomize"] or {})
    for name, kwarg in (("cube_half_size", "cube_half_size_range"), ("push_friction", "push_friction_range")):
        if args[kwarg] is not None:
            if name in randomize:
                raise ValueError(f"PushCubeRL: give {kwarg} or randomize[{name!r}], not both")
            ranges[name] = _check_range(kwarg, args[kwarg], RANDOMIZABLE[name])
    for name, value in randomize.items():
        if name not in RANDOMIZABLE:
            raise ValueError(
                f"PushCubeRL: randomize has an unknown parameter {name!r}; parameters: {', '.join(RANDOMIZABLE)}"
            )
        ranges[name] = _check_range(f"randomize[{name!r}]", value, RANDOMIZABLE[name])
    return ranges


def _camera(eye: torch.Tensor, target: torch.Tensor, height: int, width: int):
    """A pinhole camera at ``eye`` looking at ``target`` (z up): a function from world points [..., 3] to pixel
    column, pixel row and depth along the view axis (each [...])."""
    forward = (target - eye) / (target - eye).norm()
    right = torch.linalg.cross(forward, torch.tensor([0.0, 0.0, 1.0]))
    right = right / right.norm()
    up = torch.linalg.cross(right, forward)
    focal = 0.5 * width / math.tan(0.5 * CAMERA_FOV)

    def project(points: torch.Tensor):
        rel = points.float() - eye
        depth = (rel @ forward).clamp_min(1e-3)
        return width / 2 + focal * (rel @ right) / depth, height / 2 - focal * (rel @ up) / depth, depth

    return project


def _convex_polygon(px: torch.Tensor, py: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Pixels inside the convex polygon with vertices (xs, ys) in order (either orientation)."""
    crosses = [(xs[(i + 1) % len(xs)] - xs[i]) * (py - ys[i]) - (ys[(i + 1) % len(xs)] - ys[i]) * (px - xs[i])
               for i in range(len(xs))]  # fmt: skip
    stacked = torch.stack(crosses)
    return (stacked >= 0).all(0) | (stacked <= 0).all(0)


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
