#!/usr/bin/env python3
"""Convert a PyTorch state_dict to a Huddle model file (HUDDLEM1), and back.

  scripts/torch_to_huddle.py model.pt model.bin            # state_dict -> HUDDLEM1
  scripts/torch_to_huddle.py --reverse model.bin model.pt  # HUDDLEM1 -> state_dict

The Huddle file is what a job's `model: {file: model.bin}` reads: an external model whose tensors
are the state_dict's floating-point entries, in state_dict order and under their state_dict names,
as float32 (half, bfloat16 and double are converted), their values the job's initial global model.
Entries that are not floating-point tensors (BatchNorm's num_batches_tracked, integer buffers,
non-tensors) are skipped with a message on stderr: the clients' trainers keep those themselves.

INPUT for the forward direction is a file written by torch.save: a state_dict (a mapping of names
to tensors) or a checkpoint dict holding a state_dict under "state_dict" or "model_state_dict" (or
under --key). It is loaded with torch.load(weights_only=True), which reads tensors and plain
containers and never runs code from the file; a file that needs more (a pickled nn.Module, an
optimizer, any other Python object) is refused. --unsafe-run-code-in-input loads it with the full
unpickler (its state_dict() is then taken from an nn.Module): that runs whatever code the file
holds, so use it only for a file you wrote yourself.

Byte format (common/tensor_io.h; all little-endian, no checksum):
  "HUDDLEM1", u32 count, then per tensor:
  u32 name_len, name (UTF-8), u32 rank, i64 dims[rank], f32 data[prod(dims)] (row-major)

The converter checks what a Huddle job will check (models/model.h, external models): at most 256
tensors, unique names of 1-128 characters of [A-Za-z0-9_.:/-], every dimension >= 1, at most 2^28
elements per tensor and 2^31 in total, finite values; it stops with an error naming the tensor
otherwise. --reverse writes an OrderedDict of float32 tensors with torch.save (load it with
model.load_state_dict(torch.load(path), strict=False) when buffers were skipped).

Needs Python 3 and torch (Debian: python3-torch).
"""

import argparse
import collections
import inspect
import math
import pickle
import re
import struct
import sys

MAGIC = b"HUDDLEM1"
MAX_TENSORS = 256
MAX_NAME_BYTES = 128
MAX_TENSOR_ELEMENTS = 1 << 28
MAX_PARAMS = 1 << 31
MAX_RANK = 8
NAME_RE = re.compile(r"^[A-Za-z0-9_.:/-]+$")


class ConversionError(Exception):
    pass


def note(message):
    print(f"torch_to_huddle: {message}", file=sys.stderr)


def import_torch():
    try:
        import torch  # noqa: PLC0415 (imported late so --help works without torch)
    except ImportError as e:
        raise ConversionError(
            f"cannot import torch ({e}); install it (Debian: apt install python3-torch) or run "
            "this script with the Python that has it (e.g. /usr/bin/python3)") from e
    return torch


def load_state_dict(torch, path, key, trust_code):
    # torch.load without weights_only runs whatever the file's pickle says (any Python code): a
    # model file from someone else is data, never code. Only --unsafe-run-code-in-input lifts that,
    # for a file the user wrote themselves.
    if "weights_only" not in inspect.signature(torch.load).parameters and not trust_code:
        raise ConversionError(
            f"this torch ({torch.__version__}) cannot load a file without running the code it holds "
            "(torch.load has no weights_only before 1.13): upgrade torch, or pass "
            "--unsafe-run-code-in-input if you wrote the file yourself")
    try:
        if trust_code:
            note(f"--unsafe-run-code-in-input: {path} is unpickled with the full unpickler; any "
                 "code it holds runs now, as this user")
            obj = torch.load(path, map_location="cpu", weights_only=False)
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise ConversionError(f"{path}: no such file") from e
    except pickle.UnpicklingError as e:
        raise ConversionError(
            f"{path}: holds more than tensors and plain containers (a pickled nn.Module, optimizer "
            f"or other Python object), which loading would have to run as code ({e}). Save the "
            "model's state_dict instead (torch.save(model.state_dict(), path)); only for a file "
            "you wrote yourself, --unsafe-run-code-in-input loads it with the full unpickler") from e
    except Exception as e:
        raise ConversionError(f"{path}: not a file torch.load can read ({e})") from e
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict()
    if not isinstance(obj, collections.abc.Mapping):
        raise ConversionError(f"{path}: holds a {type(obj).__name__}, not a state_dict")
    if key is not None:
        if key not in obj:
            raise ConversionError(f"{path}: no entry '{key}' (it has: {', '.join(map(str, obj))})")
        obj = obj[key]
    elif not any(isinstance(v, torch.Tensor) for v in obj.values()):
        for k in ("state_dict", "model_state_dict", "model"):
            if isinstance(obj.get(k), collections.abc.Mapping):
                note(f"using the state_dict under '{k}'")
                obj = obj[k]
                break
    if not isinstance(obj, collections.abc.Mapping):
        raise ConversionError(f"{path}: the entry is a {type(obj).__name__}, not a state_dict")
    return obj


def check_name(name, index):
    if not isinstance(name, str):
        raise ConversionError(f"tensor {index}: its name {name!r} is not a string")
    if not name or len(name.encode()) > MAX_NAME_BYTES or not NAME_RE.match(name):
        raise ConversionError(
            f"tensor {index} ('{name}'): names must be 1-{MAX_NAME_BYTES} characters of "
            "[A-Za-z0-9_.:/-] (Huddle's external models)")


def to_huddle(args):
    torch = import_torch()
    state = load_state_dict(torch, args.input, args.key, args.unsafe_run_code_in_input)
    tensors = []
    total = 0
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            note(f"skipping '{name}': not a tensor ({type(value).__name__})")
            continue
        if not value.is_floating_point():
            note(f"skipping '{name}': its dtype {str(value.dtype).replace('torch.', '')} is "
                 "not floating point (the clients' trainers keep such buffers themselves)")
            continue
        check_name(name, len(tensors))
        t = value.detach().to(device="cpu", dtype=torch.float32).contiguous()
        shape = list(t.shape)
        where = f"tensor {len(tensors)} ('{name}')"
        if len(shape) > MAX_RANK:
            raise ConversionError(f"{where}: rank {len(shape)} exceeds {MAX_RANK}")
        if any(d < 1 for d in shape):
            raise ConversionError(f"{where}: shape {shape} has a dimension < 1")
        if t.numel() > MAX_TENSOR_ELEMENTS:
            raise ConversionError(f"{where}: {t.numel()} elements exceed {MAX_TENSOR_ELEMENTS}")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).flatten().nonzero()[0])
            raise ConversionError(f"{where}: element {bad} is {t.flatten()[bad].item()}")
        if value.dtype != torch.float32:
            note(f"'{name}': {str(value.dtype).replace('torch.', '')} converted to float32")
        total += t.numel()
        tensors.append((name, shape, t))
    if not tensors:
        raise ConversionError(f"{args.input}: no floating-point tensors to convert")
    if len(tensors) > MAX_TENSORS:
        raise ConversionError(f"{len(tensors)} tensors; a Huddle model has at most {MAX_TENSORS}")
    if len({n for n, _, _ in tensors}) != len(tensors):
        raise ConversionError("two tensors have the same name")
    if total > MAX_PARAMS:
        raise ConversionError(f"{total} parameters; a Huddle model has at most {MAX_PARAMS}")
    with open(args.output, "wb") as out:
        out.write(MAGIC)
        out.write(struct.pack("<I", len(tensors)))
        for name, shape, t in tensors:
            encoded = name.encode()
            out.write(struct.pack("<I", len(encoded)))
            out.write(encoded)
            out.write(struct.pack("<I", len(shape)))
            out.write(struct.pack(f"<{len(shape)}q", *shape))
            out.write(t.numpy().astype("<f4", copy=False).tobytes(order="C"))
    print(f"torch_to_huddle: wrote {len(tensors)} tensors ({total:,} parameters) to {args.output}")


def read_huddle(path):
    """The (name, shape, bytes) of every tensor of a HUDDLEM1 file, with its structure checked."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as e:
        raise ConversionError(f"{path}: no such file") from e
    pos = 0

    def take(n, what):
        nonlocal pos
        if n > len(data) - pos:
            raise ConversionError(f"{path}: truncated at byte {pos} ({what})")
        chunk = data[pos:pos + n]
        pos += n
        return chunk

    if take(8, "magic") != MAGIC:
        raise ConversionError(f"{path}: not a Huddle model file (bad magic)")
    (count,) = struct.unpack("<I", take(4, "tensor count"))
    if count > 1 << 16:
        raise ConversionError(f"{path}: {count} tensors exceeds the limit")
    out = []
    for i in range(count):
        (name_len,) = struct.unpack("<I", take(4, f"tensor {i} name length"))
        if name_len > 1024:
            raise ConversionError(f"{path}: tensor {i} name too long")
        name = take(name_len, f"tensor {i} name").decode("utf-8", errors="replace")
        (rank,) = struct.unpack("<I", take(4, f"tensor {i} rank"))
        if rank > MAX_RANK:
            raise ConversionError(f"{path}: tensor {i} rank {rank}")
        shape = list(struct.unpack(f"<{rank}q", take(8 * rank, f"tensor {i} shape")))
        if any(d < 1 for d in shape):
            raise ConversionError(f"{path}: tensor {i} ('{name}') shape {shape}")
        numel = math.prod(shape)
        out.append((name, shape, take(4 * numel, f"tensor {i} ('{name}') data")))
    if pos != len(data):
        raise ConversionError(f"{path}: {len(data) - pos} trailing bytes")
    return out


def to_torch(args):
    torch = import_torch()
    state = collections.OrderedDict()
    for name, shape, raw in read_huddle(args.input):
        t = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape).clone()
        state[name] = t
    torch.save(state, args.output)
    print(f"torch_to_huddle: wrote {len(state)} tensors to {args.output} (a state_dict)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert a PyTorch state_dict to a Huddle model file (HUDDLEM1), or back.")
    parser.add_argument("input", help="torch.save file (or, with --reverse, a HUDDLEM1 file)")
    parser.add_argument("output", help="HUDDLEM1 file (or, with --reverse, a torch.save file)")
    parser.add_argument("--reverse", action="store_true",
                        help="convert a HUDDLEM1 file back to a state_dict")
    parser.add_argument("--key", help="the entry of a checkpoint dict that holds the state_dict")
    parser.add_argument("--unsafe-run-code-in-input", action="store_true",
                        help="load INPUT with the full unpickler, which runs any code the file "
                             "holds: only for a file you wrote yourself (a pickled nn.Module)")
    args = parser.parse_args(argv)
    try:
        (to_torch if args.reverse else to_huddle)(args)
    except ConversionError as e:
        print(f"torch_to_huddle: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
