"""Fashion-MNIST for the PyTorch client: Debian's IDX files, sharded as Huddle shards them.

The IID partition is Huddle's own (data/partition.cc, IidPartition), rewritten here bit for bit:
the row indices 0..n-1 shuffled by Fisher-Yates with xoshiro256** (common/rng.cc) seeded with
DeriveSeed(seed, 1), cut at s*n/k, each shard sorted. With the job's seed (`seed:` in the job
YAML, which `huddle run` passes its clients as --partition-seed) a PyTorch client holds exactly the
rows the built-in client of the same shard holds, so the two federations train on the same data.
"""

import gzip
import os

import numpy as np

_MASK = (1 << 64) - 1


def _splitmix64(x):
    """One SplitMix64 step: (new state, output)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return x, z ^ (z >> 31)


def derive_seed(a, b=0, c=0):
    """common/rng.cc DeriveSeed."""
    _, h = _splitmix64(a)
    _, h = _splitmix64(h ^ b)
    _, h = _splitmix64(h ^ c)
    return h


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & _MASK


class Rng:
    """common/rng.h Rng: xoshiro256** seeded through SplitMix64 (only what the partition uses)."""

    def __init__(self, seed):
        self.s = []
        x = seed & _MASK
        for _ in range(4):
            x, out = _splitmix64(x)
            self.s.append(out)

    def next(self):
        s = self.s
        result = (_rotl((s[1] * 5) & _MASK, 7) * 9) & _MASK
        t = (s[1] << 17) & _MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def uniform_int(self, n):
        """Uniform in [0, n): Lemire's multiply-shift with rejection, as Rng::UniformInt."""
        if n <= 1:
            return 0
        m = self.next() * n
        low = m & _MASK
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & _MASK
        return m >> 64

    def shuffle(self, v):
        for i in range(len(v), 1, -1):
            j = self.uniform_int(i)
            v[i - 1], v[j] = v[j], v[i - 1]


def iid_shard(n, num_shards, shard, seed):
    """The sorted row indices of `shard` of Huddle's IID partition of n rows."""
    if not 1 <= num_shards <= n:
        raise ValueError(f"num_shards is {num_shards}; it must be in [1, {n}]")
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is outside [0, {num_shards})")
    order = list(range(n))
    Rng(derive_seed(seed, 1)).shuffle(order)
    rows = order[shard * n // num_shards:(shard + 1) * n // num_shards]
    return np.array(sorted(rows), dtype=np.int64)


def _read_idx(path):
    """An IDX file (gzipped or raw; Debian ships them gzipped) as a uint8 array of its shape."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {body.size} bytes of data for dimensions {dims}")
    return body.reshape(dims)


def load_split(directory, split, num_shards=1, shard=0, seed=0, limit=0):
    """This client's rows of `split` ("train" or "t10k"): images as float32 [n, 1, 28, 28] in
    [0, 1] (Huddle scales pixels by 1/255) and labels as int64 [n]. `limit` > 0 keeps the shard's
    first `limit` rows."""
    images = _read_idx(os.path.join(directory, f"{split}-images-idx3-ubyte"))
    labels = _read_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte"))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{directory}: {images.shape[0]} {split} images, {labels.shape[0]} labels")
    rows = iid_shard(labels.shape[0], num_shards, shard, seed)
    if limit > 0:
        rows = rows[:limit]
    x = images[rows].astype(np.float32) / np.float32(255.0)
    return x.reshape(len(rows), 1, images.shape[1], images.shape[2]), labels[rows].astype(np.int64)
