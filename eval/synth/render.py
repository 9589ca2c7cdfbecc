"""Frame rendering with Pillow: each scene family (source domain) has its own look.

A `Look` fixes a family's background (gradient and pattern), floor texture, furniture colours, light tint on the
object palette and camera framing; a video jitters the camera and the pattern so no two videos look identical.
Frames are drawn at `SUPERSAMPLE` times the output size and box-reduced (cheap anti-aliasing); the output of
`render_frame` depends only on the record, the frame index and the look, so PNGs are byte-identical on rebuild.

Image coordinates: ``px = (x - cx) * s + W / 2``, ``py = H / 2 - (y - cy) * s`` with the record's camera
``(cx, cy, zoom)`` and ``s = zoom * W / 160`` (zoom is pixels per world unit at 160 pixels wide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from eval.synth import record as R
from eval.synth.scenes import FLOOR_Y
from eval.synth.vocab import COLORS

SUPERSAMPLE = 2
"""Frames are drawn this many times larger, then box-reduced."""
DEFAULT_SIZE = (160, 120)
"""Default output frame size (width, height)."""
FEATURE_GRID = (16, 12)
"""The `pixels` feature space: an object-centred crop box-downsampled to 16 x 12 RGB (576 dims)."""
FEATURE_CROP = (64, 48)
"""Size (output pixels) of the crop centred on the segment's / prefix's object (shifted to stay inside the frame):
a multi-object scene frame shows every object, the crop shows the one the segment or query is about."""

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Look:
    """The appearance of one scene family."""

    sky_top: RGB
    sky_bottom: RGB
    pattern: str  # clouds | stripes | diagonal | tiles
    pattern_color: RGB
    floor: RGB
    floor_pattern: str  # grass | checker | planks | concrete
    furniture: dict[str, RGB]
    light: tuple[float, float, float]
    outline: RGB
    camera: tuple[float, float, float]  # cx, cy, zoom


LOOKS: dict[str, Look] = {
    "ramp": Look((150, 196, 236), (226, 238, 246), "clouds", (250, 250, 252), (84, 150, 64), "grass",
                 {"ramp": (176, 122, 70), "table": (150, 98, 56), "gate": (90, 90, 96), "wall": (120, 150, 170),
                  "leg": (110, 80, 50), "container": (130, 130, 130)},
                 (1.05, 1.0, 0.92), (40, 40, 40), (184.0, 122.0, 0.45)),
    "table_push": Look((228, 214, 186), (206, 190, 160), "stripes", (196, 176, 140), (176, 170, 160), "checker",
                       {"table": (122, 74, 42), "leg": (96, 58, 32), "wall": (170, 150, 120),
                        "ramp": (140, 100, 60), "gate": (80, 80, 80), "container": (120, 120, 120)},
                       (1.0, 0.9, 0.78), (60, 40, 20), (186.0, 118.0, 0.45)),
    "dominoes": Look((44, 52, 72), (70, 80, 104), "diagonal", (84, 96, 124), (158, 112, 70), "planks",
                     {"table": (210, 210, 214), "leg": (150, 150, 156), "ramp": (226, 226, 232),
                      "gate": (230, 60, 60), "wall": (60, 66, 84), "container": (120, 120, 120)},
                     (0.9, 0.95, 1.1), (236, 236, 236), (152.0, 102.0, 0.53)),
    "container": Look((196, 200, 204), (160, 166, 172), "tiles", (176, 182, 188), (108, 108, 112), "concrete",
                      {"container": (70, 110, 150), "wall": (140, 146, 152), "table": (120, 120, 120),
                       "leg": (100, 100, 100), "ramp": (120, 120, 120), "gate": (80, 80, 80)},
                      (0.85, 0.95, 1.05), (20, 24, 30), (200.0, 130.0, 0.47)),
}


def camera_for(domain: str, rng: np.random.Generator) -> tuple[float, float, float]:
    """The family's camera with a small per-video jitter (centre +-6 units, zoom +-4 %)."""
    cx, cy, zoom = LOOKS[domain].camera
    return (round(cx + float(rng.uniform(-6, 6)), 2), round(cy + float(rng.uniform(-6, 6)), 2),
            round(zoom * float(rng.uniform(0.96, 1.04)), 4))


class Renderer:
    """Draws the frames of one video. The static layer (background, floor, furniture) is drawn once."""

    def __init__(self, rec: R.SimRecord, look: Look, pattern_seed: int, size: tuple[int, int] = DEFAULT_SIZE):
        self.rec, self.look, self.size = rec, look, size
        self.w, self.h = size[0] * SUPERSAMPLE, size[1] * SUPERSAMPLE
        cx, cy, zoom = (float(v) for v in rec.camera)
        self.cx, self.cy, self.s = cx, cy, zoom * size[0] / 160.0 * SUPERSAMPLE
        self.static = self._static_layer(np.random.default_rng(pattern_seed))

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

    def in_view(self, frame: int, k: int, margin: float = 2.0) -> bool:
        """True when object ``k``'s bounding circle lies inside the (output) image at ``frame``."""
        x, y = (float(v) for v in self.rec.pos[frame, k])
        r = float(np.hypot(*self.rec.sizes[k])) / 2
        (px, py), = self.to_px(np.array([x, y]))
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
        for kind, verts, until in zip(self.rec.static_kind, self.rec.static_vertices, self.rec.static_until,
                                      strict=True):
            if kind in ("floor", "gate") or not math.isinf(until):
                continue
            self._draw_static(draw, str(kind), verts)
        return out

    def _draw_static(self, draw: ImageDraw.ImageDraw, kind: str, verts: np.ndarray) -> None:
        fill = self.look.furniture.get(kind, (128, 128, 128))
        dark = tuple(int(c * 0.6) for c in fill)
        pts = self.to_px(verts)
        draw.polygon(pts, fill=fill, outline=dark, width=SUPERSAMPLE)
        if kind in ("table", "ramp"):  # a lighter top edge reads as a surface
            top = sorted(pts, key=lambda p: p[1])[:2]
            light = tuple(min(255, int(c * 1.3) + 20) for c in fill)
            draw.line(sorted(top), fill=light, width=SUPERSAMPLE * 2)

    def render(self, frame: int) -> Image.Image:
        """The output-size RGB frame ``frame``."""
        rec = self.rec
        img = self.static.copy()
        draw = ImageDraw.Draw(img)
        t = float(rec.t[frame])
        for kind, verts, until in zip(rec.static_kind, rec.static_vertices, rec.static_until, strict=True):
            if not math.isinf(until) and t < until:
                self._draw_static(draw, str(kind), verts)
        if not np.isnan(rec.pusher_pos[frame, 0]):
            pw, ph = (float(v) for v in rec.pusher_size)
            px, py = (float(v) for v in rec.pusher_pos[frame])
            quad = np.array([(px - pw / 2, py - ph / 2), (px + pw / 2, py - ph / 2), (px + pw / 2, py + ph / 2),
                             (px - pw / 2, py + ph / 2)])
            draw.polygon(self.to_px(quad), fill=(150, 156, 164), outline=(70, 74, 80), width=SUPERSAMPLE)
            (hx, hy), = self.to_px(np.array([px - pw / 2, py + ph / 2]))
            draw.line([(hx, hy), (hx - 14 * SUPERSAMPLE, hy - 8 * SUPERSAMPLE)], fill=(70, 74, 80),
                      width=SUPERSAMPLE * 2)
        for k in range(rec.n_objects):
            self._draw_object(draw, frame, k)
        return img.reduce(SUPERSAMPLE)

    def _draw_object(self, draw: ImageDraw.ImageDraw, frame: int, k: int) -> None:
        rec, look = self.rec, self.look
        base = COLORS[str(rec.colors[k])]
        fill = tuple(min(255, int(c * m)) for c, m in zip(base, look.light, strict=True))
        dark = tuple(int(c * 0.55) for c in fill)
        x, y = (float(v) for v in rec.pos[frame, k])
        a = float(rec.angle[frame, k])
        w, h = (float(v) for v in rec.sizes[k])
        if rec.held[frame, k]:  # the gripper's cable and claw
            (cx, cy), = self.to_px(np.array([x, y + h / 2]))
            draw.line([(cx, 0), (cx, cy)], fill=look.outline, width=SUPERSAMPLE)
            draw.line([(cx - 4 * SUPERSAMPLE, cy), (cx + 4 * SUPERSAMPLE, cy)], fill=look.outline,
                      width=SUPERSAMPLE * 2)
        if str(rec.shapes[k]) == "ball":
            r = w / 2
            (px, py), = self.to_px(np.array([x, y]))
            rp = r * self.s
            draw.ellipse([px - rp, py - rp, px + rp, py + rp], fill=fill, outline=dark, width=SUPERSAMPLE)
            (ex, ey), = self.to_px(np.array([x + r * 0.85 * math.cos(a), y + r * 0.85 * math.sin(a)]))
            draw.line([(px, py), (ex, ey)], fill=dark, width=SUPERSAMPLE)
            return
        c, s = math.cos(a), math.sin(a)
        corners = np.array([(-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)])
        world = corners @ np.array([[c, s], [-s, c]]) + np.array([x, y])
        draw.polygon(self.to_px(world), fill=fill, outline=dark, width=SUPERSAMPLE)
        if str(rec.shapes[k]) == "domino":  # the domino's dividing line
            mid = np.array([(-w / 2, 0.0), (w / 2, 0.0)]) @ np.array([[c, s], [-s, c]]) + np.array([x, y])
            draw.line(self.to_px(mid), fill=dark, width=SUPERSAMPLE)


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
    else:  # tiles
        period = rng.uniform(16, 24) * SUPERSAMPLE
        ox, oy = rng.uniform(0, period, size=2)
        mask = 0.7 * ((np.mod(xx + ox, period) < SUPERSAMPLE) | (np.mod(yy + oy, period) < SUPERSAMPLE))
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
    else:  # concrete
        tex = 1.0 + 0.07 * rng.standard_normal((fh, w))
    img = img.copy()
    img[row:] = color * tex[..., None]
    img[row: row + SUPERSAMPLE] = color * 0.6
    return img


def pixel_feature(img: Image.Image, center: tuple[float, float]) -> np.ndarray:
    """(576,) float32: the `FEATURE_CROP` crop of ``img`` centred on ``center`` (pixels; shifted to stay inside
    the image), box-downsampled to `FEATURE_GRID`, RGB in [0, 1], mean-centred (not yet L2-normalised)."""
    cw, ch = min(FEATURE_CROP[0], img.width), min(FEATURE_CROP[1], img.height)
    x0 = int(round(min(max(center[0] - cw / 2, 0), img.width - cw)))
    y0 = int(round(min(max(center[1] - ch / 2, 0), img.height - ch)))
    crop = img.crop((x0, y0, x0 + cw, y0 + ch))
    small = np.asarray(crop.resize(FEATURE_GRID, Image.Resampling.BOX), np.float32).reshape(-1) / 255.0
    return small - small.mean()
