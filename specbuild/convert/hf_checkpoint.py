"""Opening a Hugging Face checkpoint directory without loading it.

`HFCheckpoint` reads `config.json` and the weight files' headers (single file, sharded with an index, or —
only when the user opts in — pickle `.bin` files) and checks that they agree with each other, so that a
missing shard or a truncated file fails before any output exists. Tensors are then fetched one at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specbuild.convert.safetensors_format import FileSpan
from specbuild.convert.safetensors_reader import MappedFile, TensorInfo, read_header
from specbuild.errors import MISSING_MODEL, CheckpointError
from specbuild.pickle_weights import check_pickle_allowed, load_pickled_state

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PICKLE_SINGLE = "pytorch_model.bin"


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise CheckpointError(f"{path}: {what} is missing") from err
    except PermissionError as err:
        raise CheckpointError(f"{path}: cannot read {what} ({err.strerror})") from err
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {what} must be a JSON object")
    return data


def _index_files(index_path: Path) -> dict[str, Path]:
    """Map tensor name -> shard path from an HF index file, checking that every shard exists."""
    index = _read_json(index_path, "weight index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: has no 'weight_map'")
    shards = {name: index_path.parent / str(file) for name, file in weight_map.items()}
    for shard in sorted(set(shards.values())):
        if not shard.is_file():
            raise CheckpointError(
                f"{shard}: shard listed in {index_path.name} is missing",
                hint="the download is incomplete; fetch the missing shard",
            )
    return shards


class HFCheckpoint:
    """A Hugging Face model directory, opened lazily: config, tensor names, shapes and dtypes."""

    def __init__(self, directory: Path, *, allow_pickle: bool = False) -> None:
        self.directory = directory
        if not directory.exists():
            raise CheckpointError(f"{directory}: model directory does not exist", hint=MISSING_MODEL)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: is not a directory (give the Hugging Face model directory)")
        try:
            names = {p.name for p in directory.iterdir()}
        except PermissionError as err:
            raise CheckpointError(f"{directory}: cannot list directory ({err.strerror})") from err
        self.config = _read_json(directory / "config.json", "model config (config.json)")
        self.infos: dict[str, TensorInfo] = {}
        self.weight_files: list[Path] = []
        self.index_file: Path | None = None
        self._maps: dict[Path, MappedFile] = {}
        self._pickled: dict[str, torch.Tensor] = {}
        if SAFETENSORS_INDEX in names:
            self.index_file = directory / SAFETENSORS_INDEX
            self._open_safetensors(_index_files(self.index_file))
        elif SAFETENSORS_SINGLE in names:
            self._open_safetensors(None)
        elif any(n.endswith(".safetensors") for n in names):
            raise CheckpointError(
                f"{directory}: has safetensors shards but no {SAFETENSORS_INDEX}",
                hint="copy the index file that came with the shards",
            )
        elif PICKLE_INDEX in names or PICKLE_SINGLE in names:
            self._open_pickle(names, allow_pickle)
        else:
            raise CheckpointError(f"{directory}: no weights found (expected {SAFETENSORS_SINGLE} or shards)")

    # -- opening ------------------------------------------------------------------------------------------
    def _open_safetensors(self, shards: dict[str, Path] | None) -> None:
        files = sorted(set(shards.values())) if shards else [self.directory / SAFETENSORS_SINGLE]
        for file in files:
            for name, info in read_header(file).items():
                if shards is not None and shards.get(name) != file:
                    continue  # the index is authoritative for duplicated names
                self.infos[name] = info
        if shards is not None:
            for name, shard in shards.items():
                if name not in self.infos:
                    raise CheckpointError(
                        f"{shard}: does not contain tensor {name!r}, which {SAFETENSORS_INDEX} places there",
                        hint="the shard and the index come from different downloads",
                    )
        self.weight_files = files

    def _open_pickle(self, names: set[str], allow_pickle: bool) -> None:
        files = (
            sorted(set(_index_files(self.directory / PICKLE_INDEX).values()))
            if PICKLE_INDEX in names
            else [self.directory / PICKLE_SINGLE]
        )
        check_pickle_allowed(files, allow_pickle=allow_pickle)
        for file in files:
            for name, tensor in load_pickled_state(file, mmap=True).items():
                self._pickled[name] = tensor
                self.infos[name] = TensorInfo(name, file, tensor.dtype, tuple(tensor.shape), 0, 0)
        self.weight_files = files

    def include_safetensors(self, path: Path, prefix: str, strip: str = "") -> list[str]:
        """Add another safetensors file's tensors as sources named `prefix + name` (e.g. Medusa heads), each name
        without a leading `strip`."""
        names = []
        for stored, info in read_header(path).items():
            name = stored.removeprefix(strip) if strip else stored
            self.infos[prefix + name] = info
            names.append(name)
        self.weight_files.append(path)
        return names

    def include_pickle(self, path: Path, prefix: str, strip: str = "", *, allow_pickle: bool,
                       safe_format: str = "safetensors") -> list[str]:
        """Like include_safetensors for a torch.save file, only with the user's opt-in (`safe_format`: what the
        refusal says to convert it to)."""
        check_pickle_allowed([path], allow_pickle=allow_pickle, safe_format=safe_format)
        loaded = load_pickled_state(path, mmap=True)
        state = {(k.removeprefix(strip) if strip else k): v for k, v in loaded.items()}
        for name, tensor in state.items():
            self._pickled[prefix + name] = tensor
            self.infos[prefix + name] = TensorInfo(prefix + name, path, tensor.dtype, tuple(tensor.shape), 0, 0)
        self.weight_files.append(path)
        return list(state)

    # -- access ---------------------------------------------------------------------------------------------
    @property
    def input_files(self) -> list[Path]:
        """Every file the conversion reads, for the manifest."""
        extra = [self.index_file] if self.index_file else []
        return [self.directory / "config.json", *extra, *self.weight_files]

    def tensor(self, name: str) -> torch.Tensor:
        """A (zero-copy where possible) view of one source tensor."""
        if name in self._pickled:
            return self._pickled[name]
        info = self.infos[name]
        mapped = self._maps.get(info.path)
        if mapped is None:
            mapped = self._maps[info.path] = MappedFile(info.path)
        return mapped.tensor(info)

    def span_of(self, tensor: torch.Tensor) -> FileSpan | None:
        """Where `tensor`'s bytes lie in a weight file, when it is an untouched slice of one: the writer then
        lets the kernel copy them instead of faulting them in through the memory map."""
        for mapped in self._maps.values():
            span = mapped.span_of(tensor)
            if span is not None:
                return span
        return None

    def release(self, name: str) -> None:
        """Tell the OS this process is done with a tensor's pages."""
        info = self.infos[name]
        mapped = self._maps.get(info.path)
        if mapped is not None:
            mapped.release(info)

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()
        self._pickled.clear()
