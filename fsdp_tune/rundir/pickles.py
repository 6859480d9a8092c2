"""A checkpoint is data, not code: every pickle a resume will load is read here first, before any rank starts.

A pickle names the functions that rebuild it, and loading it calls them: a checkpoint folder can run any
command on the machine that resumes it. What a resume loads (torch 2.13, transformers 5, accelerate 1.15, by
reading): torch DCP reads each `.metadata` with plain `pickle.load` (filesystem.py read_metadata) and the
non-tensor items of the `.distcp` shards with `torch.load(weights_only=False)` (default_planner.py load_bytes);
the Trainer and accelerate `torch.load(weights_only=True)` rng_state*.pth, scheduler.pt, optimizer.bin /
optimizer.pt, scaler.pt and the FULL_STATE_DICT .bin files (torch's own allowlist, unless
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set). All of them are checked the same way here.

The unpickler below builds nothing and calls nothing: every global a pickle names must be on ALLOWED (what
DCP and the Trainer write, read from real checkpoints of the tiny model, SHARDED and FULL) and becomes an
inert record; torch's persistent ids must be its `storage` tuples. DCP's metadata is then walked to every
item it points at, which must lie inside a shard of the same folder and be a torch.save archive holding
nothing but data.pkl and raw storages. No torch import: the names are compared as strings.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
import zipfile
from pathlib import Path

_DCP = "torch.distributed.checkpoint."
_DTYPES = (
    "float32 float16 bfloat16 float64 int64 int32 int16 int8 uint8 bool complex64 complex128 "
    "float8_e4m3fn float8_e5m2 uint16 uint32 uint64"
).split()
_STORAGES = "Float BFloat16 Half Double Long Int Short Char Byte Bool ComplexFloat ComplexDouble Untyped".split()
ALLOWED = frozenset(
    # DCP's .metadata (Metadata and what it holds)
    [f"{_DCP}metadata.{n}" for n in ("Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties")]
    + [f"{_DCP}metadata.{n}" for n in ("TensorStorageMetadata", "BytesStorageMetadata", "StorageMeta")]
    + [f"{_DCP}metadata._MEM_FORMAT_ENCODING", f"{_DCP}filesystem._StorageInfo"]
    + ["pathlib.PosixPath", "pathlib._local.PosixPath", "torch.Size", "torch.serialization._get_layout"]
    + [f"torch.{d}" for d in _DTYPES]
    # torch.save archives: tensors and their storages, ordered dicts; the rng states' numpy arrays
    + ["torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter", "collections.OrderedDict"]
    + [f"torch.{s}Storage" for s in _STORAGES]
    + ["numpy.ndarray", "numpy.dtype", "numpy.dtypes.UInt32DType", "_codecs.encode"]
    + [f"numpy.{core}.multiarray._reconstruct" for core in ("_core", "core")]
)
# what a torch.save zip archive holds besides data.pkl (anything else, TorchScript's code/ or constants.pkl
# included, is refused: torch.load hands such an archive to torch.jit.load)
_ARCHIVE_MEMBER = re.compile(
    r"^[^/]+/(data\.pkl|data/\d+|byteorder|version|\.format_version|\.storage_alignment"
    r"|\.data/serialization_id|\.data/version)$"
)
TORCH_FILES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
# saved by the Trainer (into every checkpoint before transformers 5), loaded by no resume (transformers 5.24,
# accelerate 1.15, by reading), and a pickle of TrainingArguments and its enums, which no allowlist should admit
NOT_LOADED = ("training_args.bin",)
_DCP_METADATA = re.compile(r"^(__\d+_?)?\.metadata$")


class Unsafe(Exception):
    """Why a file of a checkpoint must not be loaded: `what` names the offending piece."""

    def __init__(self, file: Path, what: str):
        self.file = file
        self.what = what
        super().__init__(f"{file}: {what}")


class _Record:
    """What an allowed global becomes: its arguments and state, kept as data; nothing is called."""

    name = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items = args, None, []
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):
        self.items.append((key, value))

    def append(self, value):
        self.items.append(value)

    def extend(self, values):
        self.items.extend(values)

    def fields(self) -> dict:
        """A dataclass's fields, as pickle's BUILD gave them (a dict, or (dict, slots) for slotted classes)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            return {**(state[0] or {}), **(state[1] or {})}
        return state if isinstance(state, dict) else {}


class _Codecs(_Record):
    """_codecs.encode(text, 'latin1'): how protocol 2 writes bytes; any other codec is refused."""

    def __new__(cls, *args, **kwargs):
        if len(args) != 2 or not isinstance(args[0], str) or args[1] not in ("latin1", "latin-1"):
            raise pickle.UnpicklingError(f"_codecs.encode called with {args[1:]!r} (only 'latin1' is written)")
        return super().__new__(cls, *args)


class _NumpyDtype(_Record):
    """numpy.dtype(code, ...): plain numbers only; an object dtype would unpickle whatever its array holds."""

    def __new__(cls, *args, **kwargs):
        if not args or not isinstance(args[0], str) or not re.fullmatch(r"[?biufcmMUS]\d*", args[0]):
            raise pickle.UnpicklingError(f"numpy.dtype({args[0] if args else ''!r}): not a plain number type")
        return super().__new__(cls, *args)


_SPECIAL = {"_codecs.encode": _Codecs, "numpy.dtype": _NumpyDtype}


class _Checker(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        qualified = f"{module}.{name}"
        if qualified not in ALLOWED:
            raise _Refused(qualified)
        return type(name, (_SPECIAL.get(qualified, _Record),), {"name": qualified})

    def persistent_load(self, pid):
        ok = isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
        if not ok or not isinstance(pid[1], type) or not issubclass(pid[1], _Record):
            raise pickle.UnpicklingError(f"a persistent id other than torch's storages: {pid!r:.80}")
        if not (isinstance(pid[2], str) and isinstance(pid[3], str) and isinstance(pid[4], int)):
            raise pickle.UnpicklingError(f"a malformed storage id: {pid!r:.80}")
        return pid


class _Refused(pickle.UnpicklingError):
    def __init__(self, qualified: str):
        self.qualified = qualified
        super().__init__(qualified)


def read_pickle(data: io.BufferedIOBase, file: Path, whole: bool = True):
    """The pickle in `data` as inert records, or Unsafe naming the class or function it would call.
    `whole`: the stream must end with it (torch's legacy format hides further pickles behind the first)."""
    try:
        value = _Checker(data).load()
    except _Refused as err:
        raise Unsafe(file, f"it would call {err.qualified}, which no checkpoint of DCP or the Trainer holds") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise Unsafe(file, f"not a pickle fsdp-tune can check ({type(err).__name__}: {err})") from None
    except RecursionError:
        raise Unsafe(file, "nested too deep to check") from None
    if whole and data.read(1):
        raise Unsafe(file, "more data follows its pickle (torch's legacy format, or something appended)")
    return value


def check_archive(data: io.BufferedIOBase, file: Path) -> None:
    """A torch.save zip archive: only data.pkl and raw storages, and data.pkl within ALLOWED."""
    try:
        archive = zipfile.ZipFile(data)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise Unsafe(file, f"not a torch.save archive fsdp-tune can check ({err})") from None
    with archive:
        names = archive.namelist()
        strange = [n for n in names if not _ARCHIVE_MEMBER.match(n) or n.split("/")[0] != names[0].split("/")[0]]
        if strange or not any(n.endswith("/data.pkl") for n in names):
            raise Unsafe(file, f"a torch.save archive with other members ({', '.join(strange[:3]) or 'no data.pkl'})")
        for name in names:
            if name.endswith("/data.pkl"):
                with archive.open(name) as member:
                    read_pickle(io.BufferedReader(member), file)


def check_torch_file(path: Path) -> None:
    """A file the Trainer or accelerate torch.loads: a zip archive, or else one plain pickle and nothing after."""
    with open(path, "rb") as f:
        if zipfile.is_zipfile(f):
            f.seek(0)
            check_archive(f, path)
        else:
            f.seek(0)
            read_pickle(f, path)


def check_dcp(metadata: Path) -> None:
    """DCP's metadata, then every item it points at: a slice of a shard in the same folder, a torch.save archive."""
    with open(metadata, "rb") as f:
        root = read_pickle(f, metadata)
    if not isinstance(root, _Record) or root.name != f"{_DCP}metadata.Metadata":
        raise Unsafe(metadata, "not DCP metadata (its pickle is not a Metadata)")
    storage = root.fields().get("storage_data") or {}
    if not isinstance(storage, dict):
        raise Unsafe(metadata, "its storage_data is not a mapping")
    shards: dict[str, int] = {}
    for info in storage.values():
        rel, offset, length = _item(info, metadata)
        if rel not in shards:
            shards[rel] = _shard_size(metadata.parent / rel, metadata)
        if offset + length > shards[rel]:
            raise Unsafe(metadata, f"an item points past the end of {rel} ({offset}+{length} > {shards[rel]} bytes)")
        with open(metadata.parent / rel, "rb") as f:
            check_archive(_Window(f, offset, length), metadata.parent / rel)


def _item(info, metadata: Path) -> tuple[str, int, int]:
    if not isinstance(info, _Record) or info.name != f"{_DCP}filesystem._StorageInfo":
        raise Unsafe(metadata, "an item's storage info is not DCP's _StorageInfo")
    fields = info.fields()
    rel, offset, length = fields.get("relative_path"), fields.get("offset"), fields.get("length")
    if not isinstance(rel, str) or "/" in rel or "\\" in rel or rel in ("", ".", ".."):
        raise Unsafe(metadata, f"an item lies outside its folder ({rel!r:.80})")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (offset, length)):
        raise Unsafe(metadata, f"an item of {rel} has no valid offset and length")
    if fields.get("transform_descriptors"):
        raise Unsafe(
            metadata,
            f"an item of {rel} is stored transformed ({fields['transform_descriptors']!r:.60}): it cannot be checked",
        )
    return rel, offset, length


def _shard_size(path: Path, metadata: Path) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        raise Unsafe(metadata, f"it points at {path.name}, which is not there") from None
    if not stat.S_ISREG(st.st_mode):
        raise Unsafe(metadata, f"it points at {path.name}, which is not a regular file")
    return st.st_size


class _Window(io.RawIOBase):
    """[offset, offset + length) of an open file, as a file of its own (what DCP hands torch.load)."""

    def __init__(self, f, offset: int, length: int):
        self.f, self.offset, self.length, self.pos = f, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, min(self.length, base + pos))
        return self.pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.length - self.pos)
        self.f.seek(self.offset + self.pos)
        data = self.f.read(n)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def check_checkpoint(folder: str | Path) -> Unsafe | None:
    """The first file of `folder` a resume must not load, or None when every pickle in it is data.

    Links and other non-regular files are refused too: what a link points at was never part of the checkpoint."""
    for root, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(root) / name
            try:
                _check_entry(path)
            except Unsafe as unsafe:
                return unsafe
            except OSError as err:
                return Unsafe(path, f"cannot be read ({err.strerror or err})")
    return None


def _check_entry(path: Path) -> None:
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise Unsafe(path, "a link or special file inside a checkpoint (a checkpoint holds plain files)")
    if stat.S_ISDIR(mode):
        return
    if _DCP_METADATA.match(path.name):
        check_dcp(path)
    elif path.suffix in TORCH_FILES and path.name not in NOT_LOADED:
        check_torch_file(path)
