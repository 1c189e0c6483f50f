"""PushCubeRL's arm and cube: what moves them in a control step.

``PushCubeArm`` holds methods of the env (``env.PushCubeRLVecEnv`` inherits them) that read and write its state
tensors (``qpos``, ``qvel``, ``tcp_pos``, ``cube_xy``, ``cube_yaw``, ``cube_vel``):

* the constants they use, made once (``_setup_arm``, called by the env's ``__init__``): the joint and motion limits,
  also as full [N, 7] tensors, the rest pose, and the contacts' full-size constants;
* the action's joint step (``_joint_step_command``) and the Panda's velocity, acceleration and TCP speed limits
  (``_limit_joint_step``, ``_stoppable``, ``_cap_tcp_speed``);
* the step itself, with the TCP held on the table or the cube's top (``_move_arm``, ``_lift_within_limits``,
  ``_support_height``, ``_clip_to_limits``);
* the cube pushed out of the TCP sphere (``_resolve_contacts``, ``_to_cube_frame``) and sliding on (``_slide``).

The Panda's kinematic model (DH parameters, limits, batched forward kinematics, Jacobian) is ``franka.py``.
"""

from __future__ import annotations

import math

import torch

from cleanrl_embodied.shared.envs.push_cube import franka
from cleanrl_embodied.shared.envs.push_cube.options import (
    ABOVE_CUBE_TOLERANCE,
    CONTROL_DT,
    DLS_DAMPING,
    GRAVITY,
    MAX_LIFT,
    TCP_RADIUS,
)


class PushCubeArm:
    """Methods of the env that move the arm and the cube: they read and write its state tensors (see the module
    docstring). Not an env on its own."""

    def _setup_arm(self, contact_substeps: int) -> None:
        """The constants of the methods below, made once by ``__init__``: the joint limits and motion limits (also
        as full [N, 7] tensors), the rest pose, and the full-size constants of ``_resolve_contacts``."""
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
