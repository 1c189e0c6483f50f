"""Kinematic model of the Franka Emika Panda arm: DH parameters, joint limits, batched FK, Jacobian.

The arm is described with the modified (Craig) Denavit-Hartenberg convention published by Franka
Emika. The transform from frame i-1 to frame i is

    T_i = RotX(alpha_i) @ TransX(a_i) @ RotZ(q_i) @ TransZ(d_i)

and joint i turns about the z axis of frame i. Past joint 7 come the flange (0.107 m along z7) and
the hand, whose tool centre point (TCP, between the fingertips) lies 0.1034 m further along the same
axis. Only positions are modelled here (no dynamics, no collision geometry).

Everything is plain batched tensor code: configurations are ``[N, 7]`` tensors and results keep the
batch dimension first, so the functions run on any device and under ``torch.func`` transforms.
Positions are returned in the world frame, with the robot base at ``base_pos`` (no base rotation).
"""

from __future__ import annotations

import functools
import math

import torch

NUM_JOINTS = 7

# Modified DH parameters of joints 1..7 (metres and radians).
DH_A = (0.0, 0.0, 0.0, 0.0825, -0.0825, 0.0, 0.088)
DH_D = (0.333, 0.0, 0.316, 0.0, 0.384, 0.0, 0.0)
DH_ALPHA = (0.0, -math.pi / 2, math.pi / 2, math.pi / 2, -math.pi / 2, math.pi / 2, math.pi / 2)

FLANGE_OFFSET = 0.107  # flange along z7
TCP_OFFSET = 0.1034  # hand TCP past the flange, along the same axis
TCP_DISTANCE_FROM_FRAME7 = FLANGE_OFFSET + TCP_OFFSET

JOINT_LOWER = (-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973)
JOINT_UPPER = (2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973)

# Motion limits of the Panda arm from Franka Emika's datasheet: per-joint velocity (rad/s) and acceleration
# (rad/s^2) limits, and the maximum Cartesian translation speed of the end effector (m/s).
JOINT_VELOCITY_LIMIT = (2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61)
JOINT_ACCELERATION_LIMIT = (15.0, 7.5, 10.0, 12.5, 15.0, 20.0, 20.0)
MAX_TCP_SPEED = 1.7

# Arm tucked above the workspace, hand pointing down (ManiSkill's Panda "rest" keyframe).
# With the base at DEFAULT_BASE_POS its TCP sits at world (0.0, 0.0, 0.170).
REST_QPOS = (0.0, math.pi / 8, 0.0, -5 * math.pi / 8, 0.0, 3 * math.pi / 4, math.pi / 4)

# Base position in the world as in ManiSkill's table-top scenes: table top at z = 0, workspace around x = 0.
DEFAULT_BASE_POS = (-0.615, 0.0, 0.0)

# Points returned by forward_kinematics: base, origins of frames 1..7, TCP.
NUM_FK_POINTS = NUM_JOINTS + 2

# sin(alpha_i), exactly -1, 0 or 1 for the Panda: the x rotation of each link is a signed axis swap.
_ALPHA_SIGN = tuple(round(math.sin(alpha)) for alpha in DH_ALPHA)


def joint_limits(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Lower and upper joint limits as float32 tensors of shape [7]."""
    lower = torch.tensor(JOINT_LOWER, dtype=torch.float32, device=device)
    upper = torch.tensor(JOINT_UPPER, dtype=torch.float32, device=device)
    return lower, upper


def motion_limits(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Joint velocity (rad/s) and acceleration (rad/s^2) limits as float32 tensors of shape [7]."""
    velocity = torch.tensor(JOINT_VELOCITY_LIMIT, dtype=torch.float32, device=device)
    acceleration = torch.tensor(JOINT_ACCELERATION_LIMIT, dtype=torch.float32, device=device)
    return velocity, acceleration


def rest_qpos(device: torch.device | str = "cpu") -> torch.Tensor:
    """The rest configuration as a float32 tensor of shape [7]."""
    return torch.tensor(REST_QPOS, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=32)
def constant(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A tuple of constants as a tensor on ``device``, made once: copying a Python list to a GPU every step
    would block on the host each time."""
    return torch.tensor(values, dtype=dtype, device=device)


def link_transforms(q: torch.Tensor) -> torch.Tensor:
    """Parent-to-child transforms of the 7 links, built all at once: [N, 7] -> [N, 7, 4, 4]."""
    a = constant(tuple(DH_A), q.device, q.dtype)
    d = constant(tuple(DH_D), q.device, q.dtype)
    alpha = constant(tuple(DH_ALPHA), q.device, q.dtype)
    cos_a, sin_a = torch.cos(alpha), torch.sin(alpha)
    cos_q, sin_q = torch.cos(q), torch.sin(q)
    zero = torch.zeros_like(q)
    one = torch.ones_like(q)
    rows = (
        cos_q, -sin_q, zero, a.expand_as(q),
        sin_q * cos_a, cos_q * cos_a, (-sin_a).expand_as(q), (-sin_a * d).expand_as(q),
        sin_q * sin_a, cos_q * sin_a, cos_a.expand_as(q), (cos_a * d).expand_as(q),
        zero, zero, zero, one,
    )  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(*q.shape, 4, 4)


def frame_transforms(q: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS) -> torch.Tensor:
    """World transforms of frames 1..7 and of the TCP frame: [N, 7] -> [N, 8, 4, 4].

    The TCP frame is frame 7 shifted along its z axis (the hand's rotation about z does not
    change the TCP position, so it is left out).
    """
    links = link_transforms(q)
    world = links[:, 0].clone()
    world[:, :3, 3] += constant(tuple(base_pos), q.device, q.dtype)
    frames = [world]
    for i in range(1, NUM_JOINTS):
        world = world @ links[:, i]
        frames.append(world)
    tcp = world.clone()
    tcp[:, :3, 3] += world[:, :3, 2] * TCP_DISTANCE_FROM_FRAME7
    frames.append(tcp)
    return torch.stack(frames, dim=1)


def forward_kinematics(q: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS) -> torch.Tensor:
    """World positions of the base, the 7 joint frames and the TCP: [N, 7] -> [N, 9, 3].

    Consecutive points are joined by the arm's links, which is what a renderer needs.
    """
    origins = frame_transforms(q, base_pos)[:, :, :3, 3]
    base = constant(tuple(base_pos), q.device, q.dtype).expand(q.shape[0], 1, 3)
    return torch.cat([base, origins], dim=1)


def tcp_position(q: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS) -> torch.Tensor:
    """World position of the TCP: [N, 7] -> [N, 3] (see :func:`tcp_position_rows`, which the env's step uses)."""
    return tcp_position_rows(q.T.contiguous(), base_pos).T.contiguous()


def tcp_position_rows(
    q_by_joint: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS
) -> torch.Tensor:
    """World position of the TCP, joint-major: q_by_joint [7, N] -> rows x, y, z [3, N].

    The TCP point is carried from frame 7 back to the base one link at a time, with element-wise
    ops on [N] tensors instead of 4x4 matrices (about 7x faster on CPU at N = 4096). Per link,
    in reverse order of T_i: shift by d_i along z, turn by q_i about z, shift by a_i along x, then
    turn by alpha_i about x, which for alpha in {0, +-pi/2} is just a signed swap of y and z.

    At thousands of envs on a CPU every op costs about the same, whatever it computes, so the walk spends as
    few as it can while computing each coordinate with the same float operations as the plain walk (the
    results are equal bit for bit, up to the sign of exact zeros): a coordinate known to be zero is None (no
    turn of the point on joint 7's axis, no terms with it), the swaps' negations are kept as signs and
    folded into the next add or subtract (IEEE negation is exact), and the shifts add full [N] constants
    (an op with a Python number costs about twice as much).
    """
    num = q_by_joint.shape[1]
    cos_q, sin_q = torch.cos(q_by_joint).unbind(0), torch.sin(q_by_joint).unbind(0)
    const = lambda value: _full_constant(num, value, q_by_joint)  # noqa: E731
    # (tensor or None for zero, sign): the coordinate is sign * tensor
    x, y, z = (None, 1.0), (None, 1.0), (const(TCP_DISTANCE_FROM_FRAME7), 1.0)
    for i in reversed(range(NUM_JOINTS)):
        if DH_D[i] != 0.0:
            z = _shift(z, DH_D[i], const)
        x, y = _turn(x, y, cos_q[i], sin_q[i])
        if DH_A[i] != 0.0:
            x = _shift(x, DH_A[i], const)
        if _ALPHA_SIGN[i] > 0:
            y, z = (z[0], -z[1]), y
        elif _ALPHA_SIGN[i] < 0:
            y, z = z, (y[0], -y[1])
    return torch.stack([_value(c, offset, const) for c, offset in zip((x, y, z), base_pos)])


def _full_constant(num: int, value: float, like: torch.Tensor) -> torch.Tensor:
    """A cached [num] tensor filled with ``value`` (float32 rounding, like the tensor it is added to)."""
    key = (num, value, like.dtype, like.device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.full((num,), value, dtype=like.dtype, device=like.device)
    return _CONSTANTS[key]


_CONSTANTS: dict = {}


def _shift(coord, offset: float, const):
    """coord + offset for a (tensor or None, sign) coordinate."""
    tensor, sign = coord
    if tensor is None:
        return const(offset), 1.0
    return (tensor + const(offset), 1.0) if sign > 0 else (tensor - const(offset), -1.0)


def _turn(x, y, cos, sin):
    """(c x - s y, s x + c y) for (tensor or None, sign) coordinates; the results have sign +1."""
    (tx, sx), (ty, sy) = x, y
    if tx is None and ty is None:
        return x, y
    if ty is None:
        return (cos * tx if sx > 0 else -(cos * tx), 1.0), (sin * tx if sx > 0 else -(sin * tx), 1.0)
    if tx is None:
        return (-(sin * ty) if sy > 0 else sin * ty, 1.0), (cos * ty if sy > 0 else -(cos * ty), 1.0)
    if sx < 0:  # not reached by the Panda's walk (x is never negated)
        tx, sx = -tx, 1.0
    if sy > 0:
        return (cos * tx - sin * ty, 1.0), (sin * tx + cos * ty, 1.0)
    return (cos * tx + sin * ty, 1.0), (sin * tx - cos * ty, 1.0)


def _value(coord, offset: float, const) -> torch.Tensor:
    """The true value of a (tensor or None, sign) coordinate, plus offset."""
    tensor, sign = coord
    if tensor is None:
        return const(offset).clone()
    if offset == 0.0:
        return tensor if sign > 0 else -tensor
    return tensor + const(offset) if sign > 0 else const(offset) - tensor


def tcp_position_and_jacobian(
    q: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS
) -> tuple[torch.Tensor, torch.Tensor]:
    """TCP position [N, 3] and its positional Jacobian d tcp / d q [N, 3, 7] in one pass (see
    :func:`tcp_position_and_jacobian_rows`; the Jacobian is a view of its joint-major [3, 7, N] result)."""
    position, jacobian = tcp_position_and_jacobian_rows(q.T.contiguous(), base_pos)
    return position.T.contiguous(), jacobian.permute(2, 0, 1)


def tcp_position_and_jacobian_rows(
    q_by_joint: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS
) -> tuple[torch.Tensor, torch.Tensor]:
    """TCP position and its positional Jacobian in one pass, joint-major: q_by_joint [7, N] -> rows x, y, z
    [3, N] and d tcp / d q [3, 7, N] (row a, joint j).

    Same backward walk as :func:`tcp_position_rows`, carrying 8 vectors at once as the rows of [8, N]
    buffers: row j is the derivative with respect to q_j and row 7 the TCP point. Turning joint i moves a
    point p (in frame i) by z x p = (-p_y, p_x, 0) per radian; that vector is created when the walk reaches
    joint i and from then on is turned like the point (but not shifted, being a direction). The turns run
    in place on the rows created so far (rows i..7 at joint i; the others are still zero), joint 7's turn of
    the point on its own axis is skipped, shifts add cached [N] constants, and the swaps' negations are kept
    as the signs of the y and z buffers (see :func:`tcp_position_rows`): the same values bit for bit as the
    plain walk, in about half the ops.
    """
    num, point = q_by_joint.shape[1], NUM_JOINTS
    cos_q, sin_q = torch.cos(q_by_joint).unbind(0), torch.sin(q_by_joint).unbind(0)
    const = lambda value: _full_constant(num, value, q_by_joint)  # noqa: E731
    x = q_by_joint.new_zeros(NUM_JOINTS + 1, num)
    y, z = torch.zeros_like(x), torch.zeros_like(x)
    (x_rows, y_rows, z_rows), sign_y, sign_z = (x.unbind(0), y.unbind(0), z.unbind(0)), 1.0, 1.0
    z_rows[point].fill_(TCP_DISTANCE_FROM_FRAME7)
    moved = False  # False while the point's x and y are zero (joint 7 turns it on its own axis)
    for i in reversed(range(NUM_JOINTS)):
        if DH_D[i] != 0.0:
            z_rows[point].add_(const(sign_z * DH_D[i]))
        if moved:
            # d p / d q_i = (-p_y, p_x, 0), stored with the buffers' signs (y holds sign_y * true y)
            if sign_y > 0:
                torch.neg(y_rows[point], out=x_rows[i])
                y_rows[i].copy_(x_rows[point])
            else:
                x_rows[i].copy_(y_rows[point])
                torch.neg(x_rows[point], out=y_rows[i])
            turn_x, turn_y = x[i:], y[i:]
            sin_y, sin_x = sin_q[i] * turn_y, sin_q[i] * turn_x
            if sign_y > 0:  # x' = c x - s y, y' = s x + c y
                turn_x.mul_(cos_q[i]).sub_(sin_y)
                turn_y.mul_(cos_q[i]).add_(sin_x)
            else:  # the same with y negated: x' = c x + s (-y), -y' = c (-y) - s x
                turn_x.mul_(cos_q[i]).add_(sin_y)
                turn_y.mul_(cos_q[i]).sub_(sin_x)
        moved = moved or DH_A[i] != 0.0 or _ALPHA_SIGN[i] != 0
        if DH_A[i] != 0.0:
            x_rows[point].add_(const(DH_A[i]))
        if _ALPHA_SIGN[i] > 0:  # y, z = -z, y
            (y, y_rows, sign_y), (z, z_rows, sign_z) = (z, z_rows, -sign_z), (y, y_rows, sign_y)
        elif _ALPHA_SIGN[i] < 0:  # y, z = z, -y
            (y, y_rows, sign_y), (z, z_rows, sign_z) = (z, z_rows, sign_z), (y, y_rows, -sign_y)
    signs = (1.0, sign_y, sign_z)
    position = torch.stack([_value((rows[point], sign), offset, const)
                            for rows, sign, offset in zip((x_rows, y_rows, z_rows), signs, base_pos)])  # fmt: skip
    jacobian = torch.stack([_value((buffer[:point], sign), 0.0, const) for buffer, sign in zip((x, y, z), signs)])
    return position, jacobian


def tcp_jacobian(q: torch.Tensor, base_pos: tuple[float, float, float] = DEFAULT_BASE_POS) -> torch.Tensor:
    """Positional Jacobian of the TCP, d tcp / d q: [N, 7] -> [N, 3, 7]."""
    return tcp_position_and_jacobian(q, base_pos)[1]


def damped_least_squares(jacobian: torch.Tensor, tcp_delta: torch.Tensor, damping: float = 0.01) -> torch.Tensor:
    """Joint change [N, 7] that moves the TCP by ``tcp_delta`` [N, 3] to first order, for the Jacobian [N, 3, 7]:
    the damped least-squares solution ``J^T (J J^T + damping^2 I)^-1 dx`` of ``J dq = dx`` (the smallest joint
    change; near a singularity the damping trades accuracy for bounded joint motion). See
    :func:`damped_least_squares_rows`."""
    jacobian_rows = jacobian.permute(1, 2, 0).contiguous()  # no copy for tcp_position_and_jacobian's view
    return damped_least_squares_rows(jacobian_rows, tcp_delta.T, damping).T.contiguous()


def sum_joints(terms: torch.Tensor) -> torch.Tensor:
    """Sum over the first dim (the 7 joints) of ``terms`` [7, ...], adding in the order in which torch's CPU
    kernel sums a contiguous last dim of 7 (four partial sums, the tail on the first):
    ``t0 + t4 + t5 + t6 + t1 + t2 + t3``. The env's step once summed over joints that way (``.sum(-1)`` of
    [N, ..., 7] products), and explicit adds of joint-major rows are several times faster; keeping the order
    keeps its results bit for bit."""
    t = terms.unbind(0)
    return (((((t[0] + t[4]) + t[5]) + t[6]) + t[1]) + t[2]) + t[3]


def damped_least_squares_rows(jacobian: torch.Tensor, tcp_delta: torch.Tensor, damping: float = 0.01) -> torch.Tensor:
    """:func:`damped_least_squares`, joint-major: jacobian [3, 7, N] and tcp_delta [3, N] -> joint change [7, N].

    The symmetric positive definite 3x3 system is solved in closed form (adjugate over determinant) with
    element-wise ops on [N] rows: several times faster than a batched LAPACK solve on a CPU, and nothing waits
    for the device.
    """
    m = sum_joints((jacobian.unsqueeze(1) * jacobian.unsqueeze(0)).movedim(2, 0))  # J J^T [3, 3, N]
    a, b, c = m[0, 0] + damping**2, m[0, 1], m[0, 2]
    d, e, f = m[1, 1] + damping**2, m[1, 2], m[2, 2] + damping**2
    # Adjugate of the symmetric [[a, b, c], [b, d, e], [c, e, f]].
    A, B, C = d * f - e * e, c * e - b * f, b * e - c * d
    D, E, F = a * f - c * c, b * c - a * e, a * d - b * b
    det = a * A + b * B + c * C
    x, y, z = tcp_delta.unbind(0)
    weights = torch.stack((A * x + B * y + C * z, B * x + D * y + E * z, C * x + E * y + F * z)) / det
    terms = jacobian * weights.unsqueeze(1)
    return (terms[0] + terms[1]) + terms[2]
