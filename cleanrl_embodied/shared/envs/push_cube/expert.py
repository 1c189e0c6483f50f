"""A scripted expert for PushCubeRL and PushCubeLangRL: privileged, closed-loop, batched over all envs.

``expert_action(env)`` reads the task's true state (cube, goal, TCP; never the observation, so it works in every
observation mode) and returns the action, in the env's action mode, that moves the TCP one waypoint further along:

1. rise above the cube's height if the TCP is low and away from the push line (never sweep the cube sideways);
2. travel at that height to the approach point behind the cube, on the line from the goal through the cube;
3. descend there to the cube's mid-height;
4. push through the cube's centre toward the goal (the line is recomputed every step, so drift is corrected).

The wanted TCP displacement becomes joint deltas through the damped least-squares inverse of the TCP Jacobian
(the env's own ``ee_delta_pos`` controller), scaled into [-1, 1]. It serves as the demonstrator for behaviour
cloning and as the upper reference in tests (>= 0.95 success on PushCubeLangRL's four tasks).
"""

from __future__ import annotations

import math

import torch

from cleanrl_embodied.shared.envs.push_cube import franka
from cleanrl_embodied.shared.envs.push_cube.options import DLS_DAMPING, TCP_RADIUS

__all__ = ["expert_action"]

STEP = 0.04  # metres of TCP motion asked for per control step (the arm's limits may give less)
CLEARANCE = 0.03  # metres above the cube's top while travelling
ALIGN_TOLERANCE = 0.012  # metres off the push line that still counts as on it


def expert_action(env, goal_xy: torch.Tensor | None = None) -> torch.Tensor:
    """The expert's action [N, action_dim] for the current state of ``env`` (a PushCubeRL env or a wrapper).
    ``goal_xy`` [N, 2]: push toward these points instead of the true goals (e.g. an expert deaf to the
    instruction, pushing every cube the same way)."""
    env = env.unwrapped
    tcp, cube, goal = env.tcp_pos, env.cube_xy, env.goal_xy if goal_xy is None else goal_xy
    half = env.cube_half_size
    to_goal = goal - cube
    direction = to_goal / torch.linalg.vector_norm(to_goal, dim=-1, keepdim=True).clamp_min(1e-9)  # [N, 2]
    standoff = (math.sqrt(2.0) * half + TCP_RADIUS + 0.01).unsqueeze(-1)  # clear of every corner
    approach = cube - standoff * direction
    offset = tcp[:, :2] - cube
    along = (offset * direction).sum(-1)  # < 0 behind the cube
    across = (offset[:, 0] * direction[:, 1] - offset[:, 1] * direction[:, 0]).abs()
    push_z = torch.maximum(half, torch.full_like(half, TCP_RADIUS + 0.002))
    travel_z = 2 * half + TCP_RADIUS + CLEARANCE
    low = tcp[:, 2] < 2 * half + TCP_RADIUS
    on_line = (across < ALIGN_TOLERANCE) & (along < -(half + TCP_RADIUS) * 0.5)
    at_approach = torch.linalg.vector_norm(tcp[:, :2] - approach, dim=-1) < ALIGN_TOLERANCE

    target = torch.empty_like(tcp)
    pushing = on_line & low
    descending = ~pushing & at_approach
    rising = ~pushing & ~descending & low & (tcp[:, 2] < travel_z - 0.005)
    # push: aim through the cube's centre, one step past the TCP along the line, at mid-height
    push_xy = cube - (half + TCP_RADIUS).unsqueeze(-1) * direction + STEP * direction
    target[:, :2] = torch.where(
        pushing.unsqueeze(-1),
        push_xy,
        torch.where((descending | ~rising).unsqueeze(-1), approach, tcp[:, :2]),
    )
    target[:, 2] = torch.where(pushing | descending, push_z, travel_z)
    delta = target - tcp
    norm = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)
    delta = delta * (STEP / norm.clamp_min(STEP))  # at most STEP metres
    return _to_action(env, delta)


def _to_action(env, tcp_delta: torch.Tensor) -> torch.Tensor:
    """A wanted TCP displacement [N, 3] -> the env's action in [-1, 1] (its action_mode)."""
    if env.action_mode == "ee_delta_pos":
        action = tcp_delta / env.ee_delta_scale
        return action / action.abs().amax(-1, keepdim=True).clamp_min(1.0)
    _, jacobian = franka.tcp_position_and_jacobian_rows(env.qpos.T.contiguous(), env.base_pos)
    joint_delta = franka.damped_least_squares_rows(jacobian, tcp_delta.T.contiguous(), DLS_DAMPING).T
    if env.action_mode == "joint_delta":
        action = joint_delta / env.joint_delta_scale
        return action / action.abs().amax(-1, keepdim=True).clamp_min(1.0)  # keep the direction when scaled down
    lower, upper = env.joint_lower, env.joint_upper  # joint_pos: the target pose, -1..1 over each joint's range
    return (2.0 * (env.qpos + joint_delta - lower) / (upper - lower) - 1.0).clamp(-1.0, 1.0)
