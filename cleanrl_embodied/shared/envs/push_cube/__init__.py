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

This package holds the raw task only: episode statistics are added by a wrapper. All state lives in
torch tensors on ``device``; ``step`` has no Python loop over envs and never syncs with the host.

Its modules, one job each (this ``__init__`` re-exports the public names):

* ``env.py``: ``PushCubeRLVecEnv`` and ``PushCubeLangRLVecEnv``: the constructor, reset and fresh starts, events,
  ``step``, the reward, ``state_dict``; the class inherits the methods of the three below.
* ``arm.py``: ``PushCubeArm``, what moves the arm and the cube in a step: the Panda's joint, velocity,
  acceleration and TCP speed limits, the TCP held on its support, the contacts and the sliding cube.
* ``obs.py``: ``PushCubeObs``, what a policy sees: the spaces, the flat state, sensor dropout, each ``obs_mode``'s
  observation.
* ``render.py``: ``PushCubeRenderer``, the two rasterisers: ``render()`` for videos and the observation cameras'
  height map.
* ``franka.py``: the Panda's kinematic model (DH parameters, limits, batched forward kinematics, Jacobian).
* ``options.py``: the constants, colours, camera poses, tasks and instructions, ``INTERFACE_KWARGS``, the
  defaults and the constructor's argument checks.
* ``expert.py``: ``expert_action``, the scripted, privileged expert.
"""

from cleanrl_embodied.shared.envs.push_cube import franka
from cleanrl_embodied.shared.envs.push_cube.env import PushCubeLangRLVecEnv, PushCubeRLVecEnv
from cleanrl_embodied.shared.envs.push_cube.expert import expert_action
from cleanrl_embodied.shared.envs.push_cube.options import (
    ACTION_MODES,
    CAMERA_POSES,
    CAMERAS,
    CONTROL_DT,
    CUBE_DYNAMICS,
    CUBE_ENTRIES,
    CUBE_FRICTION,
    DEFAULT_DROPOUT_RATE,
    DEFAULT_DROPOUT_STEPS,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_INSTRUCTION_LENGTH,
    DEFAULT_OBS_CAMERAS,
    DEFAULT_REWARD_WEIGHTS,
    DLS_DAMPING,
    DROPOUT_SENSORS,
    EE_DELTA_SCALE,
    GRAVITY,
    HELDOUT_INSTRUCTIONS,
    IMAGE_OBS_MODES,
    INSTRUCTION_SETS,
    INTERFACE_KWARGS,
    JOINT_DELTA_SCALE,
    LANG_TASKS,
    OBS_CAMERA_KEYS,
    OBS_CUBE_COLOR,
    OBS_DIM,
    OBS_GOAL_CENTRE_COLOR,
    OBS_GOAL_REGION_COLOR,
    OBS_LAYOUT,
    OBS_MODES,
    PROPRIO_DIM,
    PUSH_POINT_MARGIN,
    RANDOMIZABLE,
    REACH_THRESHOLD,
    SENSOR_MISSING_KEY,
    SLIDING_OBS_LAYOUT,
    TASKS,
    TCP_RADIUS,
    WRIST_VIEW_WIDTH,
)

__all__ = [
    "ACTION_MODES",
    "CAMERAS",
    "CAMERA_POSES",
    "CONTROL_DT",
    "CUBE_DYNAMICS",
    "CUBE_ENTRIES",
    "CUBE_FRICTION",
    "DEFAULT_DROPOUT_RATE",
    "DEFAULT_DROPOUT_STEPS",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_INSTRUCTION_LENGTH",
    "DEFAULT_OBS_CAMERAS",
    "DEFAULT_REWARD_WEIGHTS",
    "DLS_DAMPING",
    "DROPOUT_SENSORS",
    "EE_DELTA_SCALE",
    "GRAVITY",
    "HELDOUT_INSTRUCTIONS",
    "IMAGE_OBS_MODES",
    "INSTRUCTION_SETS",
    "INTERFACE_KWARGS",
    "JOINT_DELTA_SCALE",
    "LANG_TASKS",
    "OBS_CAMERA_KEYS",
    "OBS_CUBE_COLOR",
    "OBS_DIM",
    "OBS_GOAL_CENTRE_COLOR",
    "OBS_GOAL_REGION_COLOR",
    "OBS_LAYOUT",
    "OBS_MODES",
    "PROPRIO_DIM",
    "PUSH_POINT_MARGIN",
    "PushCubeLangRLVecEnv",
    "PushCubeRLVecEnv",
    "RANDOMIZABLE",
    "REACH_THRESHOLD",
    "SENSOR_MISSING_KEY",
    "SLIDING_OBS_LAYOUT",
    "TASKS",
    "TCP_RADIUS",
    "WRIST_VIEW_WIDTH",
    "expert_action",
    "franka",
]
