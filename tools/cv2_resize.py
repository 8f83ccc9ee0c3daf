"""OpenCV's bilinear resize of 8-bit images, bit for bit, without OpenCV: what mmcv's `imresize` hands the models.

The OpenMMLab pipelines of LAE-DINO (mmdet), SegEarth-OV (mmseg) and DenoDet (mmdet) resize with `mmcv.imresize`
(mmcv `image/geometric.py` L77-117: `cv2.resize(img, size, interpolation=cv2.INTER_LINEAR)`), on the uint8 image,
so the model sees 8-bit values, rounded the way OpenCV's fixed-point code rounds them, before normalisation. This is
OpenCV's `resize` for CV_8U and INTER_LINEAR (`imgproc/src/resize.cpp`):
- taps: f = (d + 0.5) * (src / dst) - 0.5 in float32, s = floor(f), weights (1 - frac, frac) x 2048 rounded half to
  even into int16; along x a tap left of 0 or at/after the last pixel becomes (s clamped, weight 0); along y both
  rows are clamped into the image and the weights kept;
- horizontal pass into int32: p0 * w0 + p1 * w1; vertical pass as OpenCV's SIMD kernel computes it:
  ((r0 >> 4) * w0 >> 16) + ((r1 >> 4) * w1 >> 16), then (v + 2) >> 2, saturated to 0..255;
- an exact 2x reduction on both axes is INTER_AREA's 2x2 mean, (a + b + c + d + 2) >> 2, as OpenCV switches to it.
Checked against opencv-python-headless 5.1.0 (`cv2.resize`), outside the repo: 19 images from 37x53 to 2048x2048
resized to 512x512 (up, down, exact 2x; noise and smooth) and 10 small cases (1 and 3 channels, row lengths that are
no multiple of 16): identical. `tests/tools/fixtures/cv2_resize_linear.npz` keeps OpenCV's output for the small ones.
"""

from __future__ import annotations

import numpy as np

COEF_SCALE = 2048  # INTER_RESIZE_COEF_SCALE (11 bits)


def _taps(src: int, dst: int, clamp_weights: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    position = ((np.arange(dst) + 0.5) * (1.0 / (dst / src)) - 0.5).astype(np.float32)
    first = np.floor(position).astype(np.int64)
    frac = (position - first.astype(np.float32)).astype(np.float32)
    if clamp_weights:  # x: OpenCV zeroes the fraction at both borders
        outside = (first < 0) | (first >= src - 1)
        frac[outside] = 0.0
        first = np.clip(first, 0, src - 1)
    w0 = np.rint((np.float32(1.0) - frac) * np.float32(COEF_SCALE)).astype(np.int64)
    w1 = np.rint(frac * np.float32(COEF_SCALE)).astype(np.int64)
    return np.clip(first, 0, src - 1), np.clip(first + 1, 0, src - 1), w0, w1


def resize_bilinear_uint8(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """`cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)` for an (H, W) or (H, W, C) uint8 array."""
    if image.dtype != np.uint8:
        raise TypeError(f"resize_bilinear_uint8 takes uint8 images, got {image.dtype}")
    if width < 1 or height < 1:
        raise ValueError(f"target size must be positive, got {width}x{height}")
    flat = image.ndim == 2
    src = (image[:, :, None] if flat else image).astype(np.int64)
    src_h, src_w = src.shape[:2]
    if (src_w, src_h) == (width, height):
        return image.copy()
    if (src_w, src_h) == (2 * width, 2 * height):  # OpenCV's INTER_AREA fast path
        out = (src[0::2, 0::2] + src[0::2, 1::2] + src[1::2, 0::2] + src[1::2, 1::2] + 2) >> 2
    else:
        x0, x1, a0, a1 = _taps(src_w, width, clamp_weights=True)
        y0, y1, b0, b1 = _taps(src_h, height, clamp_weights=False)
        rows = src[:, x0] * a0[None, :, None] + src[:, x1] * a1[None, :, None]
        top = (np.clip(rows[y0] >> 4, -32768, 32767) * b0[:, None, None]) >> 16
        bottom = (np.clip(rows[y1] >> 4, -32768, 32767) * b1[:, None, None]) >> 16
        out = (np.clip(top + bottom, -32768, 32767) + 2) >> 2
    out = np.clip(out, 0, 255).astype(np.uint8)
    return out[:, :, 0] if flat else out
