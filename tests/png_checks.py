"""A picture is a real, non-trivial PNG: opens, has a size, is not one colour."""

from __future__ import annotations

import numpy as np


def check_png(path, min_kb: int = 8) -> None:
    from matplotlib import image

    assert path.is_file() and path.stat().st_size > min_kb * 1024, path
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
    assert float(np.std(pixels[..., :3])) > 0.05  # not one colour
