"""Short names of the embedded models (`--model gemma3-270m`): resolution, what wins over what,
and the error that names the install command when a model's package is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixkv.model.checkpoints import embedded, gemma3_gguf
from radixkv.model.checkpoints.embedded import EMBEDDED_MODELS, is_short_name, resolve_model


def test_paths_pass_through_and_none_is_the_default(default_model_dir: Path) -> None:
    assert resolve_model("/some/checkpoint") == Path("/some/checkpoint")
    assert resolve_model(None) == default_model_dir
    assert resolve_model("smollm2-135m") == default_model_dir
    assert set(EMBEDDED_MODELS) >= {"gemma3-270m", "smollm2-135m"}


def test_an_existing_directory_wins_over_a_short_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_short_name("gemma3-270m")
    (tmp_path / "gemma3-270m").mkdir()
    assert not is_short_name("gemma3-270m")
    assert resolve_model("gemma3-270m") == Path("gemma3-270m")


def test_missing_package_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))  # nothing converted here
    monkeypatch.setattr(gemma3_gguf, "package_installed", lambda: False)
    with pytest.raises(FileNotFoundError) as info:
        resolve_model("gemma3-270m")
    message = str(info.value)
    assert "'gemma3-270m'" in message and gemma3_gguf.INSTALL_HINT in message
    assert not list(tmp_path.iterdir())  # no temporary directory left behind
    assert embedded.EMBEDDED_MODELS["gemma3-270m"] is gemma3_gguf.gemma3_270m_path


def test_convert_command_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    from radixkv.model.kernels.__main__ import main

    with pytest.raises(SystemExit):
        main(["--model", "no-such-model"])
    assert "not an embedded model" in capsys.readouterr().err
