"""``pathfinder``: a seeded generator of Pathfinder-style images (and the entry point of the dataset).

Pathfinder (Linsley et al., 2018; LRA's Pathfinder and Path-X) asks whether two dots are joined by
one dashed contour among distractors. This is *not* the released generator but a smaller one with
the same task: on a black ``side x side`` canvas it draws two main contours of ``dashes`` dashes
each (a dash is a short straight stroke; the heading turns by a normal step of ``curvature``
radians from dash to dash, and reflects off the borders), plus ``distractors`` shorter dashed
contours. In a *connected* image (label 1) both dots sit on the two ends of the first contour; in
a *disconnected* one (label 0) each main contour carries one dot at its start, so both classes
show two dots and two long contours and only tracing tells them apart. Contours may cross, as in
the original. Pixels are 0 (background) or 255 (ink); an image is ``side * side`` tokens in
raster order (vocabulary 256). Strokes, gaps and dots scale with ``side / 32``.

Every image is drawn from its own generator seeded by ``(seed, split, index)``, so image ``i`` of a
split does not depend on the split's size. With ``data_path`` the released images are read
instead (:mod:`transformer_vq.data.classify.pathfinder_release`).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Annotated

import numpy as np

from transformer_vq.config.choices import SPLITS
from transformer_vq.data.classify.examples import ClassificationData, Examples
from transformer_vq.data.classify.pathfinder_release import CLASS_NAMES, DIFFICULTIES, load_release
from transformer_vq.data.classify.store import cached_splits
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import WITH_PATH, WITHOUT_PATH, NonNegative, Positive, Rules
from transformer_vq.data.progress import Advance, no_progress

INK = 255
MAX_SIDE = 256
CLEARANCE = 4.0  # pixels (at side 32) between separate contours: twice a gap, so no gap looks like a crossing
TRIES = 20
DISTRACTOR_TRIES = 5  # distractors are optional: give up on one early rather than slow every image down


@functools.lru_cache(maxsize=16)
def disk_offsets(radius: float) -> np.ndarray:
    """``[K, 2]`` integer offsets (dy, dx) of the pixels within ``radius`` of a pixel centre."""
    reach = int(np.ceil(radius))
    dy, dx = np.mgrid[-reach:reach + 1, -reach:reach + 1]
    keep = dy ** 2 + dx ** 2 <= radius ** 2 + 1e-9
    return np.stack([dy[keep], dx[keep]], axis=1)


def stamp(canvas: np.ndarray, points: np.ndarray, radius: float) -> None:
    """Ink (set to :data:`INK`, or ``True``) every pixel within ``radius`` of one of ``points``
    (``[P, 2]`` float (y, x), rounded to pixel centres)."""
    centres = np.rint(points).astype(np.int64)
    pixels = (centres[:, None, :] + disk_offsets(radius)[None]).reshape(-1, 2)  # (P * K, 2)
    side = canvas.shape[0]
    inside = np.all((pixels >= 0) & (pixels < side), axis=1)
    canvas[pixels[inside, 0], pixels[inside, 1]] = INK


def contour(rng: np.random.Generator, side: int, dashes: int, scale: float, curvature: float,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(points of the dashes [P, 2], start, end)`` of one dashed contour with a random start and heading."""
    dash, gap, low = 3.0 * scale, 2.0 * scale, 2.0 * scale
    high = side - 1 - low
    y, x = rng.uniform(low, high, size=2)
    heading = rng.uniform(0, 2 * math.pi)
    turns = rng.normal(0.0, curvature, size=dashes)
    origins, steps = [], []
    for turn in turns:  # plain floats: this loop runs for every dash of every contour tried
        dy, dx = math.sin(heading), math.cos(heading)
        # reflect off a border the dash and its gap would cross
        dy = -dy if not low <= y + dy * (dash + gap) <= high else dy
        dx = -dx if not low <= x + dx * (dash + gap) <= high else dx
        origins.append((y, x))
        steps.append((dy, dx))
        y, x = min(max(y + dy * (dash + gap), low), high), min(max(x + dx * (dash + gap), low), high)
        heading = math.atan2(dy, dx) + turn
    origins, steps = np.array(origins), np.array(steps)
    t = np.linspace(0.0, dash, max(2, math.ceil(dash * 2) + 1))
    points = origins[:, None, :] + t[None, :, None] * steps[:, None, :]  # (dashes, points per dash, 2)
    return points.reshape(-1, 2), origins[0], points[-1, -1]


def placed_contour(rng: np.random.Generator, side: int, dashes: int, curvature: float, taken: np.ndarray,
                   tries: int = TRIES) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A contour none of whose points falls on ``taken`` (``[side, side]`` bool: the pixels within
    :data:`CLEARANCE` of the contours already drawn), or ``None`` after ``tries`` draws."""
    for _ in range(tries):
        drawn = contour(rng, side, dashes, side / 32, curvature)
        centres = np.rint(drawn[0]).astype(np.int64)
        if not taken[centres[:, 0], centres[:, 1]].any():
            stamp(taken, drawn[0], CLEARANCE * side / 32)
            return drawn
    return None


def layout(rng: np.random.Generator, side: int, dashes: int, distractors: int, curvature: float,
           ) -> tuple[int, list[np.ndarray], np.ndarray]:
    """``(label, strokes, dots)`` of one image: the points of every contour (the two main ones first)
    and the ``[2, 2]`` dot centres; label 1 when both dots end the first contour."""
    label = int(rng.integers(2))
    for _ in range(TRIES):
        taken = np.zeros((side, side), dtype=bool)
        first, first_start, first_end = placed_contour(rng, side, dashes, curvature, taken)
        placed = placed_contour(rng, side, dashes, curvature, taken)
        if placed is not None:
            break
    else:
        raise DataError(f"pathfinder: no room for two separate contours of {dashes} dashes on a {side}x{side} "
                        f"image; lower dashes or raise side")
    second, second_start, _ = placed
    strokes = [first, second]
    for _ in range(distractors):  # a distractor that finds no room is left out
        distractor = placed_contour(rng, side, max(1, dashes // 3), curvature, taken, DISTRACTOR_TRIES)
        if distractor is not None:
            strokes.append(distractor[0])
    dots = np.array([first_start, first_end] if label else [first_start, second_start])
    return label, strokes, dots


def render(side: int, strokes: list[np.ndarray], dots: np.ndarray) -> np.ndarray:
    """The ``[side, side]`` ``uint8`` image of a :func:`layout`: 1-pixel strokes and 3-pixel dots at side 32."""
    scale = side / 32
    canvas = np.zeros((side, side), dtype=np.uint8)
    for points in strokes:
        stamp(canvas, points, 0.5 * scale)
    stamp(canvas, dots, 1.5 * scale)
    return canvas


def generate(n: int, *, seed: int, split: str, side: int = 32, dashes: int = 8, distractors: int = 4,
             curvature: float = 0.35, advance: Advance = no_progress) -> Examples:
    """``n`` images of ``split``, image ``i`` drawn from the seed ``(seed, split, i)`` (``advance`` counts them)."""
    split_id = SPLITS.index(split)
    images = np.zeros((n, side * side), dtype=np.uint8)
    labels = np.zeros(n, dtype=np.int64)
    for i in range(n):
        labels[i], strokes, dots = layout(np.random.default_rng([seed, split_id, i]), side, dashes, distractors,
                                          curvature)
        images[i] = render(side, strokes, dots).reshape(-1)
        advance(1)
    return Examples.fixed(images, labels)


GeneratedCount = Annotated[Positive, WITHOUT_PATH]


def load_pathfinder(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                    n_train: GeneratedCount = 10_000, n_validation: GeneratedCount = 1_000,
                    n_test: GeneratedCount = 1_000, seed: Annotated[NonNegative, WITHOUT_PATH] = 0,
                    side: Annotated[int, Rules(min=8, max=MAX_SIDE), WITHOUT_PATH] = 32,
                    dashes: GeneratedCount = 8, distractors: Annotated[NonNegative, WITHOUT_PATH] = 4,
                    curvature: Annotated[float, Rules(min=0.0), WITHOUT_PATH] = 0.35,
                    difficulty: Annotated[str, Rules(choices=tuple(DIFFICULTIES)), WITH_PATH] = "hard",
                    ) -> ClassificationData:
    """Pathfinder: generated Pathfinder-style images (default) or the LRA release (``data_path``).

    ``difficulty`` picks the release's folder (``easy``, ``intermediate``, ``hard``) and applies with ``data_path``
    only; the size and drawing options apply to generation only (each is refused where it does not apply).
    """
    if data_path is not None:
        return load_release(data_path, cache_dir=cache_dir, difficulty=difficulty)
    sizes = {"train": n_train, "validation": n_validation, "test": n_test}
    options = dict(seed=seed, side=side, dashes=dashes, distractors=distractors, curvature=curvature)
    key = {"generator": "pathfinder-style-1", "sizes": sizes, **options}
    splits = cached_splits("pathfinder", (), key,
                           lambda _, advance: {s: generate(sizes[s], split=s, advance=advance, **options)
                                               for s in SPLITS},
                           cache_dir, total=sum(sizes.values()), unit="image")
    return ClassificationData("pathfinder", splits, vocab_size=256, n_classes=2, max_len=side * side,
                              class_names=CLASS_NAMES,
                              metadata={"generated": True, "image_shape": [side, side, 1], **key})
