"""Synthetic scenes in ten separable classes (numpy only, so a machine without Keras can make the same data).

The zoo's Keras Applications backbones are calibrated and evaluated on them (``tests/zoo/models.py``),
and ``scripts/bench_gpu.py`` draws MobileNetV2's 224×224 data from them on the GPU machine.
"""

from __future__ import annotations

import numpy as np

IMAGE = (32, 32, 3)
CLASSES = 10


def scenes(rng: np.random.Generator, n: int, shape: tuple[int, ...], colour: np.ndarray | None = None, angle: np.ndarray | None = None,
            freq: np.ndarray | None = None, phase: np.ndarray | None = None, gradient: float = 0.3) -> np.ndarray:
    """Images in 0..1 that differ the way photos do, as a whole: a colour, a brightness gradient and a
    stripe pattern per image, plus a little pixel noise. Pure pixel noise would average out in the
    first pooling layer, leaving every image with the same features."""
    h, w, c = shape
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    colour = rng.random((n, 1, 1, c)) if colour is None else colour.reshape(n, 1, 1, c)
    slope_x, slope_y = rng.normal(0, gradient, (2, n, 1, 1, c))
    freq = rng.integers(1, 5, (n, 1, 1, 1)) if freq is None else np.reshape(freq, (n, 1, 1, 1))
    phase = rng.uniform(0, 2 * np.pi, (n, 1, 1, 1)) if phase is None else np.reshape(phase, (n, 1, 1, 1))
    angle = rng.uniform(0, np.pi, (n, 1, 1, 1)) if angle is None else np.reshape(angle, (n, 1, 1, 1))
    stripes = 0.25 * np.sin(2 * np.pi * freq * (np.cos(angle) * xx[..., None] + np.sin(angle) * yy[..., None]) + phase)
    image = colour + slope_x * xx[..., None] + slope_y * yy[..., None] + stripes + rng.normal(0, 0.03, (n, h, w, c))
    return np.clip(image, 0, 1).astype(np.float32)


# Ten scene prototypes (colour, stripe angle, frequency and phase) for the Keras Applications backbones.
_PROTOTYPES = np.random.default_rng(2026)
PROTO_COLOUR = _PROTOTYPES.uniform(0.15, 0.85, (CLASSES, 3)).astype(np.float32)
PROTO_ANGLE = _PROTOTYPES.permutation(CLASSES) * np.pi / CLASSES
PROTO_FREQ = _PROTOTYPES.integers(1, 5, CLASSES)
PROTO_PHASE = _PROTOTYPES.uniform(0, 2 * np.pi, CLASSES)


def prototype_scenes(rng: np.random.Generator, n: int, shape: tuple[int, int, int] = IMAGE) -> tuple[np.ndarray, np.ndarray]:
    """Images in 0..1 of ten classes, each a scene prototype with per-image jitter (colour ±0.06,
    stripe angle ±0.08 rad, phase ±0.3 rad, brightness gradient ±0.1, pixel noise), and their true labels. The classes are separable, as
    a trained network makes its classes: a random backbone's features then cluster by class and a
    class-mean head puts its boundaries between the clusters (a head fitted on unclustered data
    cuts through the densest region, where any noise flips samples: the zoo's first version)."""
    label = rng.integers(0, CLASSES, n)
    colour = PROTO_COLOUR[label] + rng.normal(0, 0.06, (n, 3))
    angle = PROTO_ANGLE[label] + rng.normal(0, 0.08, n)
    phase = PROTO_PHASE[label] + rng.normal(0, 0.3, n)
    # Gradient 0.1, not the small models' 0.3: a random backbone's features are dominated by such
    # class-free nuisance (MobileNetV3Small: 60% FP32 accuracy and a 25k-norm head at 0.3, 85% at 0.1).
    return scenes(rng, n, shape, colour.astype(np.float32), angle=angle, freq=PROTO_FREQ[label], phase=phase, gradient=0.1), label
