#!/usr/bin/env python3
"""Random-weight GGUF files with exactly the shapes, tensor types and tokenizer of a real one.

A forward's time depends on the tensors' shapes and types, not on their values, so a GPU's cost
curve for a model can be measured on a file of random weights written where the real file cannot
travel (the device machine of issue #39 reaches no network and takes 64 MiB per call; the Qwen
files are 0.4–1.1 GB). Two steps:

    random_gguf.py skeleton REAL.gguf OUT.skel     # here: the header (metadata, tokenizer,
                                                   # tensor table) and a list of the tensors
    random_gguf.py fill OUT.skel MODEL.gguf        # there: the same header, random data

`skeleton` copies the real file's bytes up to its data section verbatim (so the tokenizer, the
chat template and every hyperparameter are the real ones) and appends a JSON table of tensors
(name, type, offset, bytes). `fill` writes that header and, for each tensor, random bytes whose
scale fields are set to a small finite half-precision value, so every weight is finite and about
the size a trained model's is (a random f16 scale would be NaN or Inf one time in 32): norms are
1, other f32 tensors small normals. Needs numpy for `fill` only.
"""

import json
import struct
import sys

# ggml type id -> (name, elements per block, bytes per block, [(byte offset of an f16 scale, value)])
# The scale values make typical weights ~0.02-0.05 for random quants (see the block layouts in
# ggml-common.h: Q4_K's d and dmin lead the block, Q6_K's d ends it, and so on); where a type has
# an offset (dmin, m) it is chosen so that weights average about zero (a common offset would make
# every matrix nearly rank one, and the model repeat one token forever).
TYPES = {
    0: ("F32", 1, 4, []),
    1: ("F16", 1, 2, []),
    2: ("Q4_0", 32, 18, [(0, 8e-3)]),
    3: ("Q4_1", 32, 20, [(0, 8e-3), (2, -6e-2)]),
    6: ("Q5_0", 32, 22, [(0, 4e-3)]),
    7: ("Q5_1", 32, 24, [(0, 4e-3), (2, -6.2e-2)]),
    8: ("Q8_0", 32, 34, [(0, 5e-4)]),
    10: ("Q2_K", 256, 84, [(80, 2e-3), (82, 3e-3)]),
    11: ("Q3_K", 256, 110, [(108, 2e-4)]),
    12: ("Q4_K", 256, 144, [(0, 1.3e-4), (2, 9.75e-4)]),
    13: ("Q5_K", 256, 176, [(0, 7e-5), (2, 1.08e-3)]),
    14: ("Q6_K", 256, 210, [(208, 3e-5)]),
    30: ("BF16", 1, 2, []),
}

# The layers' weights three times the size above: at 1× the residual stream stays close to the
# token's own embedding, and with tied embeddings greedy decoding repeats one token forever (a weak
# test of tree verification); at 3× answers vary token by token.
LAYER_GAIN = 3.0
# See tensor_bytes: how many tokens stand out, and by how much.
CONFIDENT_TOKENS = 48
CONFIDENT = 4.0
MAGIC = b"GGUF"
SKEL_MAGIC = b"TSSKEL1\n"


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise SystemExit("truncated GGUF header")
        return struct.unpack("<" + fmt, data)[0]

    def string(self):
        n = self.take("Q")
        return self.f.read(n).decode("utf-8", "replace")

    # GGUF metadata value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
    # 8 string, 9 array, 10 u64, 11 i64, 12 f64.
    SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(self, vtype):
        if vtype in self.SCALARS:
            return self.take(self.SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item = self.take("I")
            n = self.take("Q")
            if item in self.SCALARS:
                size = struct.calcsize(self.SCALARS[item])
                self.f.seek(n * size, 1)
                return None
            return [self.value(item) for _ in range(n)] if item != 8 else [self.string() for _ in range(n)]
        raise SystemExit(f"unknown GGUF value type {vtype}")


def read_header(path):
    """(header bytes up to the data section, tensor table, architecture) of a GGUF file."""
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != MAGIC:
            raise SystemExit(f"{path}: not a GGUF file")
        version = r.take("I")
        if version < 2:
            raise SystemExit(f"{path}: GGUF version {version} is too old")
        n_tensors = r.take("Q")
        n_kv = r.take("Q")
        alignment, arch = 32, "?"
        for _ in range(n_kv):
            key = r.string()
            vtype = r.take("I")
            value = r.value(vtype)
            if key == "general.alignment":
                alignment = int(value)
            elif key == "general.architecture":
                arch = value
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.take("I")
            dims = [r.take("Q") for _ in range(n_dims)]
            ttype = r.take("I")
            offset = r.take("Q")
            if ttype not in TYPES:
                raise SystemExit(f"{path}: tensor {name} has ggml type {ttype}, not in this script's table")
            _, per_block, block_bytes, _ = TYPES[ttype]
            elements = 1
            for d in dims:
                elements *= d
            if elements % per_block:
                raise SystemExit(f"{path}: tensor {name} does not fill whole blocks")
            tensors.append(
                {"name": name, "type": ttype, "dims": dims, "offset": offset, "bytes": elements // per_block * block_bytes}
            )
        pos = f.tell()
        data_start = (pos + alignment - 1) // alignment * alignment
        f.seek(0)
        header = f.read(data_start)
    return header, tensors, arch


def skeleton(real, out):
    header, tensors, arch = read_header(real)
    table = json.dumps({"arch": arch, "tensors": tensors}).encode()
    with open(out, "wb") as f:
        f.write(SKEL_MAGIC)
        f.write(struct.pack("<QQ", len(header), len(table)))
        f.write(header)
        f.write(table)
    kinds = {}
    for t in tensors:
        kinds[TYPES[t["type"]][0]] = kinds.get(TYPES[t["type"]][0], 0) + 1
    total = sum(t["bytes"] for t in tensors)
    print(f"{out}: {arch}, {len(tensors)} tensors ({kinds}), {total / 2**20:.0f} MiB of weights, "
          f"{len(header) / 2**20:.1f} MiB of header")


def fill(skel, out, seed=0):
    import numpy as np

    with open(skel, "rb") as f:
        if f.read(len(SKEL_MAGIC)) != SKEL_MAGIC:
            raise SystemExit(f"{skel}: not a skeleton written by this script")
        header_len, table_len = struct.unpack("<QQ", f.read(16))
        header = f.read(header_len)
        table = json.loads(f.read(table_len))
    rng = np.random.default_rng(seed)
    with open(out, "wb") as f:
        f.write(header)
        data_start = len(header)
        for t in sorted(table["tensors"], key=lambda t: t["offset"]):
            f.seek(data_start + t["offset"])
            f.write(tensor_bytes(t, rng, np))
        # The data section ends at its last tensor; pad to the alignment as writers do.
        end = f.tell()
        f.write(b"\0" * ((-end) % 32))
    print(f"{out}: {len(table['tensors'])} random tensors")


def tensor_bytes(t, rng, np):
    name, per_block, block_bytes, scales = TYPES[t["type"]]
    elements = t["bytes"] // block_bytes * per_block
    if name == "F32":
        if "norm" in t["name"]:
            return np.ones(elements, dtype=np.float32).tobytes()
        return (rng.standard_normal(elements, dtype=np.float32) * 0.02).tobytes()
    if name in ("F16", "BF16"):
        values = rng.standard_normal(elements, dtype=np.float32) * 0.02
        if name == "F16":
            return values.astype(np.float16).tobytes()
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    blocks = rng.integers(0, 256, size=(t["bytes"] // block_bytes, block_bytes), dtype=np.uint8)
    embedding = t["name"].startswith(("token_embd", "output.weight"))
    gain = np.full(len(blocks), 1.0 if embedding else LAYER_GAIN)
    if t["name"].startswith("output.weight"):
        # A few "frequent" tokens with output rows CONFIDENT times longer: their logits stand
        # far above the rest, so the top two logits are rarely within rounding of each other,
        # as in a trained model. With every row alike, the best
        # of 150,000 random logits is a near-tie at almost every step, and a GPU's (or an
        # untiled CPU's) batch-dependent rounding flips greedy choices all the time.
        per_row = t["dims"][0] // per_block
        rows = t["dims"][1]
        for token in range(7, rows, rows // CONFIDENT_TOKENS):
            gain[token * per_row : (token + 1) * per_row] = CONFIDENT
    for offset, value in scales:
        scale = (np.float32(value) * gain).astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.tobytes()


def main(argv):
    if len(argv) == 3 and argv[0] == "skeleton":
        skeleton(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "fill":
        fill(argv[1], argv[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
