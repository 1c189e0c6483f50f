"""PushCubeRL's options: the constants, the colour palettes and camera poses, the tasks and their instructions,
``INTERFACE_KWARGS``, the constructor's defaults, and the argument checks (``_check_args``).

Everything here is plain Python (numbers, tuples, dicts): no tensors, no state. The env (``env.py``) reads its
defaults and checks its arguments here; the arm (``arm.py``), the observations (``obs.py``) and the renderers
(``render.py``) read their constants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

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
