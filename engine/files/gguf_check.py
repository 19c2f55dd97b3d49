"""Check a GGUF file before anything is dequantized (no torch here): the header read with the
stdlib, then the `gguf` package's reader for the tensor table, with every count, shape and
offset compared against the file. Every problem is a `BadGGUF` with one sentence (exit 2)."""

from __future__ import annotations

import math
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.events import BadRequest
from engine.files import gguf_layout
from engine.formats import families

MAGIC = b"GGUF"
VERSIONS = (2, 3)
# far above any real model (a 405B GGUF has ~1,100 tensors, ~50 metadata keys), far below what
# would make a reader allocate without bound
MAX_TENSORS = 100_000
MAX_KEYS = 100_000
# GGUF architecture name -> the transformers class Hearth runs (the family registry)
ARCHITECTURES = families.GGUF_ARCHITECTURES
# tensor types transformers' GGUF loader can dequantize (through gguf.quants)
PLAIN_TYPES = ("F32", "F16", "BF16")


class BadGGUF(BadRequest):
    """The GGUF file cannot be imported as it is."""


@dataclass(frozen=True)
class GGUFSummary:
    path: Path
    architecture: str  # the transformers class name
    name: str  # general.name, or the file's stem
    num_tensors: int
    num_elements: int  # all tensors together: what the 16-bit copy holds
    file_bytes: int
    tensor_types: tuple[str, ...]  # e.g. ("F32", "Q4_1"), sorted

    @property
    def bf16_bytes(self) -> int:
        return 2 * self.num_elements


def check(path: Path) -> GGUFSummary:
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise BadGGUF(f"{path}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the reader forever
        raise BadGGUF(f"{path} is not a regular file")
    if st.st_size < 24:  # /proc files (/proc/self/mem) are "regular" files of size 0
        raise BadGGUF(f"{path} is not a GGUF file (it is {st.st_size} bytes long)")
    num_tensors, num_keys = _header(path, st.st_size)
    if num_tensors == 0:
        raise BadGGUF(f"{path} holds no tensors")
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise BadGGUF(f"{path}: architecture {arch!r} is not supported (Hearth imports "
                      f"{', '.join(sorted(ARCHITECTURES))})")
    if _field(reader, "tokenizer.ggml.model") is None:
        raise BadGGUF(f"{path} carries no tokenizer (tokenizer.ggml.model is missing)")
    supported = set(PLAIN_TYPES) | _quant_types()
    types, elements = set(), 0
    for t in reader.tensors:
        type_name = getattr(t.tensor_type, "name", str(t.tensor_type))
        if type_name not in supported:
            raise BadGGUF(f"{path}: tensor {t.name} is of type {type_name}, which cannot be "
                          "dequantized here")
        n = math.prod(int(d) for d in t.shape)
        if n <= 0 or int(t.data_offset) + int(t.n_bytes) > st.st_size:
            raise BadGGUF(f"{path}: tensor {t.name} (shape {list(map(int, t.shape))}) does not "
                          "fit in the file; it is truncated or damaged")
        types.add(type_name)
        elements += n
    try:  # every tensor the header's sizes imply, and a tokenizer inside its token list
        gguf_layout.check(arch, lambda key: _field(reader, key),
                          {t.name: [int(d) for d in t.shape] for t in reader.tensors})
    except gguf_layout.LayoutError as e:
        raise BadGGUF(f"{path}: {e}") from None
    name = _field(reader, "general.name") or path.stem
    return GGUFSummary(path, ARCHITECTURES[arch], str(name), len(reader.tensors), elements,
                       st.st_size, tuple(sorted(types)))


def _header(path: Path, size: int) -> tuple[int, int]:
    """magic, version, tensor count, metadata key count: 24 bytes, little-endian."""
    try:
        with path.open("rb") as f:
            head = f.read(24)
    except OSError as e:
        raise BadGGUF(f"{path}: cannot read it ({e.strerror or e})") from None
    if len(head) < 24 or head[:4] != MAGIC:
        raise BadGGUF(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    version, num_tensors, num_keys = struct.unpack("<IQQ", head[4:24])
    if version not in VERSIONS:
        raise BadGGUF(f"{path}: GGUF version {version} is not supported (2 or 3)")
    # each tensor needs at least ~24 bytes of table and each key ~12: a count the file
    # cannot hold is a damaged or hostile header, refused before a reader allocates for it
    if (num_tensors > MAX_TENSORS or num_keys > MAX_KEYS
            or 24 + 24 * num_tensors + 12 * num_keys > size):
        raise BadGGUF(f"{path}: its header claims {num_tensors:,} tensors and {num_keys:,} "
                      "metadata keys, more than the file can hold")
    return num_tensors, num_keys


def _reader(path: Path):
    try:
        import gguf
    except ImportError:
        raise BadGGUF("importing GGUF files needs the gguf package: pip install gguf") from None
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OverflowError, struct.error, MemoryError) as e:
        raise BadGGUF(f"{path} is damaged or truncated ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def _quant_types() -> set[str]:
    import gguf.quants

    traits = getattr(gguf.quants, "_type_traits", {})
    return {getattr(t, "name", str(t)) for t in traits}
