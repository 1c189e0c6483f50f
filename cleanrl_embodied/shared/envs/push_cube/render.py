"""PushCubeRL's two rasterisers, in torch: the video renderer and the observation cameras.

``PushCubeRenderer`` holds methods of the env (``env.PushCubeRLVecEnv`` inherits them) that read its state
tensors and draw them:

* ``render()``: one env's RGB frame for videos, top-down (``_pixel_grid``, ``_disk``, ``_segment``, ``_paint``) or
  through a perspective camera (``_render_camera``, ``_camera``, ``_convex_polygon``), with Python loops and
  host reads (it is not on the training path).
* the image observations (obs_mode "rgb", "proprio+rgb", "state+rgb"): ``_render_images`` draws every env at once
  through every observation camera (``_ObsView``, set up by ``_setup_obs_camera``, ``_obs_view`` and
  ``_obs_palette``) as a height map of scatter-max keys (``_tiles``, ``_draw``, ``_render_view``), on the env's
  device with no host sync.

What each draws and its colours: the env's class docstring and ``options.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from cleanrl_embodied.shared.envs.push_cube import franka
from cleanrl_embodied.shared.envs.push_cube.options import (
    BACKGROUND_COLOR,
    BASE_COLOR,
    CAMERA_FOV,
    CAMERA_POSES,
    CUBE_COLOR,
    GOAL_CENTRE_COLOR,
    GOAL_REGION_COLOR,
    HEIGHT_QUANTUM,
    LINK_ALPHA,
    LINK_HALF_WIDTH,
    LINK_POINTS,
    MAT_CUBE,
    MAT_GOAL_CENTRE,
    MAT_GOAL_REGION,
    MAT_TCP,
    MATERIAL_BITS,
    NUM_MATERIALS,
    OBS_CAMERA_KEYS,
    OBS_CUBE_COLOR,
    OBS_GOAL_CENTRE_COLOR,
    OBS_GOAL_REGION_COLOR,
    OBS_LINK_ALPHA,
    OBS_LINK_LEVELS,
    OBS_SHADOW_FACTOR,
    OBS_SHADOW_SLOPE,
    OBS_TABLE_COLOR,
    OBS_TCP_HIGH_COLOR,
    OBS_TCP_LEVELS,
    OBS_TCP_LOW_COLOR,
    OBS_TCP_TOP_HEIGHT,
    OBS_VIEW_MARGIN,
    PUSH_POINT_MARGIN,
    RENDER_X_RANGE,
    RENDER_Y_RANGE,
    TABLE_COLOR,
    TCP_RADIUS,
    TOP_KEY_HEIGHT,
    WRIST_VIEW_WIDTH,
)


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


class PushCubeRenderer:
    """Methods of the env that draw it: they read its state tensors (see the module docstring) and, for the
    observation cameras, the views and the palette that ``_setup_obs_camera`` keeps on it. Not an env on its own."""

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
