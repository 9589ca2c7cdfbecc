"""Frame rendering with Pillow, and the ``pixels`` feature of a frame.

Appearance is drawn independently of the domain, so the domain cannot be read off the background: every video
draws its `Look` (sky gradient, wall pattern, floor texture, furniture colours, light tint) from one shared pool
(`LOOK_POOL` x random palettes), its camera from one shared range (`camera_for`: centre and zoom jitter around the
scene), and 1-4 decorative distractors (pictures, plants, shelves drawn on the wall; never simulated). Objects carry
their own texture (solid, striped, dotted, two-tone) and a marked top (a darker band) on shapes that have a pose.
Every frame gets light sensor noise (`NOISE_SIGMA`, seeded per frame).

Frames are drawn at `SUPERSAMPLE` times the output size and box-reduced. The output of `Renderer.render` depends
only on the record, the frame index, the look and the seeds, so frames are byte-identical on rebuild.

Image coordinates: ``px = (x - cx) * s + W / 2``, ``py = H / 2 - (y - cy) * s`` with the record's camera
``(cx, cy, zoom)`` and ``s = zoom * W / 160`` (zoom is pixels per world unit at 160 pixels wide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from eval.synth import record as R
from eval.synth import surfaces
from eval.synth.lexicon import COLORS, ROUND_SHAPES
from eval.synth.world import FLOOR_Y, WORLD_X

SUPERSAMPLE = 2
DEFAULT_SIZE = (160, 120)
"""Default output frame size (width, height)."""
FEATURE_GRID = (16, 12)
"""The `pixels` feature space: an object-centred crop box-downsampled to 16 x 12 RGB (576 dims)."""
FEATURE_CROP = (64, 48)
"""Size (output pixels at 160 x 120; scaled with the frame) of the crop centred on the segment's / prefix's object."""
NOISE_SIGMA = 5.0
"""Standard deviation of the per-pixel sensor noise (0-255 scale)."""
DIM = 0.8
"""Brightness of a ``dim`` surface (walls, gates) against the furniture colour (`eval.synth.surfaces.LOOKS`)."""

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Look:
    """The appearance of one video."""

    sky_top: RGB
    sky_bottom: RGB
    pattern: str  # clouds | stripes | diagonal | tiles | plain
    pattern_color: RGB
    floor: RGB
    floor_pattern: str  # grass | checker | planks | concrete | carpet
    furniture: RGB
    light: tuple[float, float, float]
    outline: RGB


PATTERNS = ("clouds", "stripes", "diagonal", "tiles", "plain")
FLOOR_PATTERNS = ("grass", "checker", "planks", "concrete", "carpet")
LOOK_POOL = 24
"""Number of distinct base looks; a video draws one and jitters its colours."""


def _rgb(rng: np.random.Generator, lo: int = 40, hi: int = 235) -> RGB:
    return tuple(int(v) for v in rng.integers(lo, hi, size=3))  # type: ignore[return-value]


def look_for(rng: np.random.Generator) -> Look:
    """One video's look: a base look from the shared pool (same for every domain) with small colour jitter."""
    base = np.random.default_rng([int(rng.integers(LOOK_POOL)), 0x100C])
    top, bottom = _rgb(base, 60, 240), _rgb(base, 60, 240)
    jitter = rng.integers(-12, 13, size=3)

    def j(c: RGB) -> RGB:
        return tuple(int(np.clip(v + d, 0, 255)) for v, d in zip(c, jitter, strict=True))  # type: ignore[return-value]

    return Look(j(top), j(bottom), str(PATTERNS[int(base.integers(len(PATTERNS)))]), j(_rgb(base)), j(_rgb(base, 50, 200)),
                str(FLOOR_PATTERNS[int(base.integers(len(FLOOR_PATTERNS)))]), j(_rgb(base, 60, 210)),
                tuple(float(v) for v in rng.uniform(0.85, 1.12, size=3)),  # type: ignore[arg-type]
                (30, 30, 34) if rng.random() < 0.7 else (230, 230, 230))


def camera_for(rec: R.SimRecord, rng: np.random.Generator) -> tuple[float, float, float]:
    """A camera framing the scene: the centre of the objects' travel (plus furniture) with +-25 units of jitter, and
    a zoom that fits it, jittered by +-15 %."""
    xs = np.concatenate([rec.pos[..., 0].ravel(), rec.static_vertices[..., 0].ravel()])
    xs = xs[(xs > WORLD_X[0] - 20) & (xs < WORLD_X[1] + 20)]
    lo, hi = np.percentile(xs, [5, 95]) if len(xs) else (WORLD_X[0], WORLD_X[1])
    cx = 0.5 * (lo + hi) + float(rng.uniform(-25, 25))
    span = max(hi - lo + 40.0, 170.0)
    zoom = 160.0 / span * float(rng.uniform(0.85, 1.15))
    cy = FLOOR_Y + 60.0 / zoom * 0.5 + float(rng.uniform(-10, 25))
    return round(cx, 2), round(cy, 2), round(zoom, 4)


class Renderer:
    """Draws the frames of one video. The static layer (background, floor, furniture, distractors) is drawn once."""

    def __init__(self, rec: R.SimRecord, look: Look, seed: int, size: tuple[int, int] = DEFAULT_SIZE):
        self.rec, self.look, self.size, self.seed = rec, look, size, seed
        self.w, self.h = size[0] * SUPERSAMPLE, size[1] * SUPERSAMPLE
        cx, cy, zoom = (float(v) for v in rec.camera)
        self.cx, self.cy, self.s = cx, cy, zoom * size[0] / 160.0 * SUPERSAMPLE
        self.static = self._static_layer(np.random.default_rng([seed, 1]))

    # --- coordinates ---
    def to_px(self, pts: np.ndarray) -> list[tuple[float, float]]:
        pts = np.asarray(pts, np.float64).reshape(-1, 2)
        px = (pts[:, 0] - self.cx) * self.s + self.w / 2
        py = self.h / 2 - (pts[:, 1] - self.cy) * self.s
        return [(round(float(a), 2), round(float(b), 2)) for a, b in zip(px, py, strict=True)]

    def object_px(self, frame: int, k: int) -> tuple[float, float]:
        """Output-image pixel position of object ``k``'s centre at ``frame``."""
        (px, py), = self.to_px(self.rec.pos[frame, k])
        return px / SUPERSAMPLE, py / SUPERSAMPLE

    def object_box(self, frame: int, k: int) -> tuple[float, float, float, float]:
        """Output-image box ``(x0, y0, x1, y1)`` of object ``k`` at ``frame`` (its rotated outline's extent, clipped
        to the image), rounded to 0.1 pixel."""
        rec = self.rec
        x, y = (float(v) for v in rec.pos[frame, k])
        w, h = (float(v) for v in rec.sizes[k])
        if str(rec.shapes[k]) in ROUND_SHAPES:
            pts = np.array([(x - w / 2, y - w / 2), (x + w / 2, y + w / 2)])
        else:
            a = float(rec.angle[frame, k])
            pts = np.array([self._rot(u, v, x, y, a) for u, v in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2),
                                                                    (-w / 2, h / 2))])
        px = np.array(self.to_px(pts)) / SUPERSAMPLE
        W, H = self.size
        x0, y0 = np.clip(px.min(0), 0, [W, H])
        x1, y1 = np.clip(px.max(0), 0, [W, H])
        return tuple(round(float(v), 1) for v in (x0, y0, x1, y1))  # type: ignore[return-value]

    def in_view(self, frame: int, k: int, margin: float = 2.0) -> bool:
        """True when object ``k``'s bounding circle lies inside the (output) image at ``frame``."""
        r = float(np.hypot(*self.rec.sizes[k])) / 2
        (px, py), = self.to_px(self.rec.pos[frame, k])
        rp, m = r * self.s, margin * SUPERSAMPLE
        return rp + m <= px <= self.w - rp - m and rp + m <= py <= self.h - rp - m

    # --- layers ---
    def _static_layer(self, rng: np.random.Generator) -> Image.Image:
        look, h, w = self.look, self.h, self.w
        rows = np.linspace(0.0, 1.0, h)[:, None, None]
        img = (np.array(look.sky_top) * (1 - rows) + np.array(look.sky_bottom) * rows) * np.ones((1, w, 1))
        img = _pattern(img, look.pattern, np.array(look.pattern_color, np.float64), rng)
        (_, floor_row), = self.to_px(np.array([0.0, FLOOR_Y]))
        img = _floor(img, int(round(floor_row)), look.floor_pattern, np.array(look.floor, np.float64), rng)
        out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(out)
        self._distractors(draw, rng, floor_row)
        for kind, verts, until in zip(self.rec.static_kind, self.rec.static_vertices, self.rec.static_until,
                                      strict=True):
            if kind in ("floor",) or not math.isinf(until):
                continue
            self._draw_static(draw, str(kind), verts)
        return out

    def _distractors(self, draw: ImageDraw.ImageDraw, rng: np.random.Generator, floor_row: float) -> None:
        """1-4 decorative shapes on the wall behind the scene (pictures, plants, shelves): never simulated."""
        for _ in range(int(rng.integers(1, 5))):
            x = float(rng.uniform(0, self.w))
            y = float(rng.uniform(0.05 * self.h, max(0.1 * self.h, floor_row - 0.2 * self.h)))
            size = float(rng.uniform(0.05, 0.14)) * self.w
            color = tuple(int(v) for v in rng.integers(30, 230, size=3))
            kind = int(rng.integers(3))
            if kind == 0:  # a picture frame
                draw.rectangle([x, y, x + size, y + size * 0.75], fill=color, outline=(40, 30, 20), width=SUPERSAMPLE * 2)
            elif kind == 1:  # a plant: pot + leaves
                draw.rectangle([x, y + size * 0.6, x + size * 0.5, y + size], fill=(150, 90, 60))
                draw.ellipse([x - size * 0.2, y, x + size * 0.7, y + size * 0.7], fill=(60, 140, 60))
            else:  # a wall shelf with a jar
                draw.rectangle([x, y + size * 0.5, x + size * 1.4, y + size * 0.58], fill=(110, 80, 50))
                draw.rectangle([x + size * 0.3, y + size * 0.1, x + size * 0.6, y + size * 0.5], fill=color)

    def _draw_static(self, draw: ImageDraw.ImageDraw, kind: str, verts: np.ndarray) -> None:
        surface = surfaces.get(kind)
        fill = self.look.furniture
        if surface.look == "dim":
            fill = tuple(int(c * DIM) for c in fill)
        elif surface.look == "inverse":
            fill = tuple(255 - c for c in fill)
        dark = tuple(int(c * 0.6) for c in fill)
        pts = self.to_px(verts)
        draw.polygon(pts, fill=fill, outline=dark, width=SUPERSAMPLE)
        if surface.top_line:
            top = sorted(pts, key=lambda p: p[1])[:2]
            light = tuple(min(255, int(c * 1.3) + 20) for c in fill)
            draw.line(sorted(top), fill=light, width=SUPERSAMPLE * 2)

    def render(self, frame: int) -> Image.Image:
        """The output-size RGB frame ``frame`` (with sensor noise)."""
        rec = self.rec
        img = self.static.copy()
        draw = ImageDraw.Draw(img)
        t = float(rec.t[frame])
        for kind, verts, until in zip(rec.static_kind, rec.static_vertices, rec.static_until, strict=True):
            if not math.isinf(until) and t < until:
                self._draw_static(draw, str(kind), verts)
        self._draw_kinematic(draw, frame)
        for k in range(rec.n_objects):
            self._draw_object(draw, frame, k)
        small = np.asarray(img.reduce(SUPERSAMPLE), np.float32)
        noise = np.random.default_rng([self.seed, 2, frame]).normal(0.0, NOISE_SIGMA, small.shape)
        return Image.fromarray(np.clip(small + noise, 0, 255).astype(np.uint8), "RGB")

    def _draw_kinematic(self, draw: ImageDraw.ImageDraw, frame: int) -> None:
        rec = self.rec
        kinds = rec.kin_kind if rec.kin_kind is not None else []
        for i, kind in enumerate(kinds):
            x, y, a = (float(v) for v in rec.kin_pose[frame, i])
            ox, oy, w, h = (float(v) for v in rec.kin_shape[i])
            c, s = math.cos(a), math.sin(a)
            corners = np.array([(ox - w / 2, oy - h / 2), (ox + w / 2, oy - h / 2), (ox + w / 2, oy + h / 2),
                                (ox - w / 2, oy + h / 2)])
            world = corners @ np.array([[c, s], [-s, c]]) + np.array([x, y])
            fill = (150, 156, 164) if kind == "pusher" else self.look.furniture
            draw.polygon(self.to_px(world), fill=fill, outline=(70, 74, 80), width=SUPERSAMPLE)
            if kind == "pusher":
                (hx, hy), = self.to_px(np.array([x - w / 2, y + h / 2]))
                draw.line([(hx, hy), (hx - 14 * SUPERSAMPLE, hy - 8 * SUPERSAMPLE)], fill=(70, 74, 80),
                          width=SUPERSAMPLE * 2)

    def _object_fill(self, k: int) -> tuple[RGB, RGB]:
        base = COLORS[str(self.rec.colors[k])]
        fill = tuple(min(255, int(c * m)) for c, m in zip(base, self.look.light, strict=True))
        return fill, tuple(int(c * 0.55) for c in fill)  # type: ignore[return-value]

    def _draw_object(self, draw: ImageDraw.ImageDraw, frame: int, k: int) -> None:
        rec = self.rec
        fill, dark = self._object_fill(k)
        x, y = (float(v) for v in rec.pos[frame, k])
        a = float(rec.angle[frame, k])
        w, h = (float(v) for v in rec.sizes[k])
        shape = str(rec.shapes[k])
        texture = str(rec.textures[k]) if rec.textures is not None else "solid"
        if rec.held[frame, k]:  # the gripper's cable and claw
            (cx, cy), = self.to_px(np.array([x, y + h / 2]))
            draw.line([(cx, 0), (cx, cy)], fill=self.look.outline, width=SUPERSAMPLE)
            draw.line([(cx - 4 * SUPERSAMPLE, cy), (cx + 4 * SUPERSAMPLE, cy)], fill=self.look.outline,
                      width=SUPERSAMPLE * 2)
        if shape in ROUND_SHAPES:
            r = w / 2
            (px, py), = self.to_px(np.array([x, y]))
            rp = r * self.s
            draw.ellipse([px - rp, py - rp, px + rp, py + rp], fill=fill, outline=dark, width=SUPERSAMPLE)
            if shape == "wheel":  # hub and spokes
                draw.ellipse([px - rp * 0.35, py - rp * 0.35, px + rp * 0.35, py + rp * 0.35], fill=dark)
                for d in (0.0, math.pi / 2):
                    (ex, ey), = self.to_px(np.array([x + r * math.cos(a + d), y + r * math.sin(a + d)]))
                    (fx, fy), = self.to_px(np.array([x - r * math.cos(a + d), y - r * math.sin(a + d)]))
                    draw.line([(ex, ey), (fx, fy)], fill=dark, width=SUPERSAMPLE)
            else:
                (ex, ey), = self.to_px(np.array([x + r * 0.85 * math.cos(a), y + r * 0.85 * math.sin(a)]))
                draw.line([(px, py), (ex, ey)], fill=dark, width=SUPERSAMPLE)
                self._texture_round(draw, px, py, rp, a, texture, dark)
            return
        flip = -1.0 if rec.mirrored else 1.0
        if shape == "wedge":
            body = [(-w / 2 * flip, -h / 2), (w / 2 * flip, -h / 2), (-w / 2 * flip, h / 2)]
        else:
            body = [(-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)]
        self._polygon(draw, body, x, y, a, fill, dark)
        # texture and the marked top: a darker band along the top face
        top_band = [(-w / 2, h / 2 - h * 0.22), (w / 2, h / 2 - h * 0.22), (w / 2, h / 2), (-w / 2, h / 2)]
        if shape == "wedge":
            top_band = [(-w / 2 * flip, h / 2 - h * 0.3), (-w / 2 * flip + w * 0.15 * flip, h / 2 - h * 0.3),
                        (-w / 2 * flip, h / 2)]
        if texture == "striped":
            for u in (-0.25, 0.0, 0.25):
                self._polygon(draw, [(u * w - w * 0.05, -h / 2), (u * w + w * 0.05, -h / 2),
                                     (u * w + w * 0.05, h / 2 - h * 0.25), (u * w - w * 0.05, h / 2 - h * 0.25)],
                              x, y, a, dark, None)
        elif texture == "dotted":
            for u, v in ((-0.25, -0.2), (0.2, 0.05), (-0.05, -0.35)):
                (px, py), = self.to_px(self._rot(u * w, v * h, x, y, a))
                rp = max(1.0, min(w, h) * 0.1 * self.s)
                draw.ellipse([px - rp, py - rp, px + rp, py + rp], fill=dark)
        elif texture == "two_tone":
            self._polygon(draw, [(0.0, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (0.0, h / 2)], x, y, a,
                          tuple(min(255, int(c * 1.25) + 25) for c in fill), None)
        self._polygon(draw, top_band, x, y, a, dark, None)
        if shape == "can":  # the lid's rim
            self._polygon(draw, [(-w / 2, h / 2 - 1.5), (w / 2, h / 2 - 1.5), (w / 2, h / 2), (-w / 2, h / 2)], x, y, a,
                          (220, 220, 220), None)

    @staticmethod
    def _rot(u: float, v: float, x: float, y: float, a: float) -> np.ndarray:
        c, s = math.cos(a), math.sin(a)
        return np.array([x + c * u - s * v, y + s * u + c * v])

    def _polygon(self, draw, body, x, y, a, fill, outline) -> None:
        pts = np.array([self._rot(u, v, x, y, a) for u, v in body])
        draw.polygon(self.to_px(pts), fill=fill, outline=outline, width=SUPERSAMPLE if outline else 0)

    def _texture_round(self, draw, px, py, rp, a, texture, dark) -> None:
        if texture == "striped":
            for d in (-0.45, 0.45):
                ex, ey = px + rp * math.cos(a + math.pi / 2) * d, py - rp * math.sin(a + math.pi / 2) * d
                dx, dy = rp * 0.85 * math.cos(a), -rp * 0.85 * math.sin(a)
                draw.line([(ex - dx, ey - dy), (ex + dx, ey + dy)], fill=dark, width=SUPERSAMPLE)
        elif texture == "dotted":
            for d in (0.0, 2.1, 4.2):
                ex, ey = px + rp * 0.5 * math.cos(a + d), py - rp * 0.5 * math.sin(a + d)
                r = max(1.0, rp * 0.16)
                draw.ellipse([ex - r, ey - r, ex + r, ey + r], fill=dark)
        elif texture == "two_tone":
            draw.pieslice([px - rp, py - rp, px + rp, py + rp], -math.degrees(a), -math.degrees(a) + 180, fill=dark)


def _pattern(img: np.ndarray, pattern: str, color: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    if pattern == "clouds":
        mask = np.zeros((h, w))
        for _ in range(int(rng.integers(3, 7))):
            cx, cy = rng.uniform(0, w), rng.uniform(0, h * 0.5)
            rx, ry = rng.uniform(w * 0.06, w * 0.16), rng.uniform(h * 0.03, h * 0.07)
            mask = np.maximum(mask, np.exp(-(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2)))
    elif pattern == "stripes":
        period = rng.uniform(14, 26) * SUPERSAMPLE
        mask = 0.5 * (np.sin(2 * np.pi * (xx + rng.uniform(0, period)) / period) > 0.3)
    elif pattern == "diagonal":
        period = rng.uniform(10, 18) * SUPERSAMPLE
        mask = 0.6 * (np.mod(xx + yy + rng.uniform(0, period), period) < SUPERSAMPLE * 1.5)
    elif pattern == "tiles":
        period = rng.uniform(16, 24) * SUPERSAMPLE
        ox, oy = rng.uniform(0, period, size=2)
        mask = 0.7 * ((np.mod(xx + ox, period) < SUPERSAMPLE) | (np.mod(yy + oy, period) < SUPERSAMPLE))
    else:
        mask = np.zeros((h, w))
    return img * (1 - mask[..., None]) + color * mask[..., None]


def _floor(img: np.ndarray, row: int, pattern: str, color: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    row = min(max(row, 0), h)
    if row >= h:
        return img
    fh = h - row
    yy, xx = np.mgrid[0:fh, 0:w].astype(np.float64)
    if pattern == "grass":
        tex = 1.0 + 0.12 * rng.standard_normal((fh, w)) + 0.08 * np.sin(xx * 0.9)
    elif pattern == "checker":
        p = 12 * SUPERSAMPLE
        tex = 0.9 + 0.2 * ((np.floor((xx + rng.uniform(0, p)) / p) + np.floor(yy / (p / 2))) % 2)
    elif pattern == "planks":
        p = 7 * SUPERSAMPLE
        tex = 1.0 + 0.1 * np.sin(xx * 0.15 + np.floor(yy / p) * 1.7) - 0.25 * (np.mod(yy, p) < SUPERSAMPLE)
    elif pattern == "carpet":
        tex = 1.0 + 0.05 * np.sin(xx * 0.6) * np.sin(yy * 0.6) + 0.04 * rng.standard_normal((fh, w))
    else:  # concrete
        tex = 1.0 + 0.07 * rng.standard_normal((fh, w))
    img = img.copy()
    img[row:] = color * tex[..., None]
    img[row: row + SUPERSAMPLE] = color * 0.6
    return img


def pixel_feature(img: Image.Image, center: tuple[float, float]) -> np.ndarray:
    """(576,) float32: the `FEATURE_CROP` crop of ``img`` (scaled with the frame size) centred on ``center``
    (pixels; shifted to stay inside the image), box-downsampled to `FEATURE_GRID`, RGB in [0, 1], mean-centred
    (not yet L2-normalised)."""
    scale = img.width / DEFAULT_SIZE[0]
    cw, ch = min(round(FEATURE_CROP[0] * scale), img.width), min(round(FEATURE_CROP[1] * scale), img.height)
    x0 = int(round(min(max(center[0] - cw / 2, 0), img.width - cw)))
    y0 = int(round(min(max(center[1] - ch / 2, 0), img.height - ch)))
    crop = img.crop((x0, y0, x0 + cw, y0 + ch))
    small = np.asarray(crop.resize(FEATURE_GRID, Image.Resampling.BOX), np.float32).reshape(-1) / 255.0
    return small - small.mean()
