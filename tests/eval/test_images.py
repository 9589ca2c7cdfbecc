"""Object windows (eval.images): what a visual space sees of a segment on a frame with several objects."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from eval.images import MIN_FRACTION, load_view, object_window


@pytest.mark.parametrize("box", [(10, 10, 20, 20), (0, 0, 5, 5), (150, 110, 160, 120), (20, 30, 140, 50)])
def test_the_window_holds_the_box_keeps_the_aspect_and_stays_inside(box):
    left, top, right, bottom = object_window(box, 160, 120)
    assert 0 <= left < right <= 160 and 0 <= top < bottom <= 120
    w, h = right - left, bottom - top
    assert w >= MIN_FRACTION * 160 - 1 and h >= MIN_FRACTION * 120 - 1
    assert abs(w / h - 160 / 120) < 0.1 or w == 160
    x0, y0, x1, y1 = box
    assert left <= x0 + 1 and right >= min(x1, 160) - 1  # the object is inside its window


def test_two_objects_of_one_frame_get_different_views(tmp_path):
    img = np.zeros((120, 160, 3), np.uint8)
    img[10:30, 10:30] = (255, 0, 0)
    img[90:110, 130:150] = (0, 0, 255)
    path = tmp_path / "f.jpg"
    Image.fromarray(img).save(path, quality=95)
    a = np.asarray(load_view(path, (10, 10, 30, 30)), np.float32)
    b = np.asarray(load_view(path, (130, 90, 150, 110)), np.float32)
    assert a[..., 0].mean() > 30 and a[..., 2].mean() < 10  # red window
    assert b[..., 2].mean() > 30 and b[..., 0].mean() < 10  # blue window
    assert load_view(path).size == (160, 120)
