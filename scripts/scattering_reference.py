"""Reference values of the 2-D scattering transform (kymatio's numpy Scattering2D) for
tests/kernels/scattering_test.cc. Run through scripts/make_scattering_reference.sh."""
import argparse
import json

import kymatio
import numpy as np
from kymatio.numpy import Scattering2D

# (channels, height, width, J, L): the Fashion-MNIST layer, a non-square two-channel image, and
# three scales (order 2 from resolution 1, filters cropped at resolution 1).
CASES = [(1, 28, 28, 2, 8), (2, 16, 20, 1, 4), (1, 24, 32, 3, 2)]


def image(c, h, w):
    """The deterministic input the C++ test builds the same way (float32 arithmetic)."""
    i = np.arange(h, dtype=np.float32)[:, None]
    j = np.arange(w, dtype=np.float32)[None, :]
    out = []
    for ch in range(c):
        a = np.float32(0.3 + 0.1 * ch)
        out.append(np.sin(a * i) * np.cos(np.float32(0.2) * j) + np.float32(0.01) * i * j)
    return np.stack(out).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cases = []
    for c, h, w, J, L in CASES:
        x = image(c, h, w)
        s = Scattering2D(J=J, shape=(h, w), L=L)(x[None])[0]  # [c, paths, oh, ow]
        paths = s.shape[1]
        flat = s.reshape(c * paths, -1).astype(np.float64)
        weights = np.arange(1, flat.shape[1] + 1, dtype=np.float64)
        cases.append({
            "channels": c, "height": h, "width": w, "scales": J, "angles": L,
            "out_h": int(s.shape[2]), "out_w": int(s.shape[3]),
            # per output channel: the sum of its values and their position-weighted sum
            "sums": flat.sum(axis=1).tolist(),
            "weighted_sums": (flat * weights).sum(axis=1).tolist(),
        })
    with open(args.out, "w") as f:
        json.dump({"kymatio": kymatio.__version__, "numpy": np.__version__, "cases": cases}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
