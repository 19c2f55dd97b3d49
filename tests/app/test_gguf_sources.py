"""GGUF files LM Studio and Ollama already hold, listed in the picker as importable (in a
temporary home), and hostile folders and manifests skipped without a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.get_model.gguf_sources import MAX_MANIFEST_BYTES, find_gguf_files
from app.models.model_picker_dialog import ENTRY_ROLE, ModelPickerDialog

HEX = "ab" * 32
OTHER_HEX = "cd" * 32


def gguf_bytes(size: int) -> bytes:
    return b"GGUF" + os.urandom(size - 4)


def ollama_manifest(digest: str, media_type: str = "application/vnd.ollama.image.model") -> str:
    return json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{OTHER_HEX}"},
        {"mediaType": media_type, "digest": digest, "size": 1}]})


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def stores(home) -> dict[str, Path]:
    """An LM Studio folder (new and old place) and an Ollama folder, one model in each."""
    new = write(home / ".lmstudio/models/lmstudio-community/SmolLM2-GGUF/SmolLM2-Q4_K_M.gguf",
                gguf_bytes(3000))
    old = write(home / ".cache/lm-studio/models/bartowski/Qwen-GGUF/Qwen-Q8_0.gguf",
                gguf_bytes(2000))
    manifests = home / ".ollama/models/manifests/registry.ollama.ai"
    write(manifests / "library/smollm2/135m", ollama_manifest(f"sha256:{HEX}"))
    blob = write(home / f".ollama/models/blobs/sha256-{HEX}", gguf_bytes(5000))
    write(home / f".ollama/models/blobs/sha256-{OTHER_HEX}", "{{ .Prompt }}")
    # not models: a projector, a file that only claims the extension, a readme
    write(new.parent / "mmproj-SmolLM2-f16.gguf", gguf_bytes(100))
    write(new.parent / "broken.gguf", b"not a gguf at all")
    write(new.parent / "README.md", "# hi")
    return {"new": new, "old": old, "ollama": blob}


def rows(dialog: ModelPickerDialog) -> list[tuple[str, str, str]]:
    t = dialog.gguf_import_panel.sources_table
    return [tuple(t.item(r, c).text() for c in range(3)) for r in range(t.rowCount())]


def test_lmstudio_and_ollama_folders_are_listed_as_importable(qtbot, settings, stores):
    found = find_gguf_files()
    assert [(s.label, s.origin, s.size_bytes) for s in found] == [
        ("lmstudio-community/SmolLM2-GGUF/SmolLM2-Q4_K_M.gguf", "LM Studio", 3000),
        ("bartowski/Qwen-GGUF/Qwen-Q8_0.gguf", "LM Studio", 2000),
        ("smollm2:135m", "Ollama", 5000),
    ]
    assert [s.path for s in found] == [stores["new"], stores["old"], stores["ollama"]]

    dialog = ModelPickerDialog(settings)
    qtbot.addWidget(dialog)
    assert rows(dialog) == [
        ("lmstudio-community/SmolLM2-GGUF/SmolLM2-Q4_K_M.gguf", "3 kB", "LM Studio"),
        ("bartowski/Qwen-GGUF/Qwen-Q8_0.gguf", "2 kB", "LM Studio"),
        ("smollm2:135m", "5 kB", "Ollama"),
    ]
    table = dialog.gguf_import_panel.sources_table
    assert all(table.cellWidget(r, 3).text() == "Import" for r in range(table.rowCount()))
    assert not dialog.gguf_import_panel.empty_label.isVisibleTo(dialog)
    # importable rows are not loadable models: the model list has the demo model only
    assert [dialog.model_list.item(i).data(ENTRY_ROLE).source
            for i in range(dialog.model_list.count())] == ["demo"]


def test_ollama_models_env_and_other_registries(home, tmp_path, monkeypatch):
    root = tmp_path / "elsewhere"
    write(root / "manifests/hf.co/bartowski/SmolLM2-GGUF/Q4_K_M", ollama_manifest(f"sha256:{HEX}"))
    blob = write(root / f"blobs/sha256-{HEX}", gguf_bytes(64))
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    [source] = find_gguf_files()
    assert (source.label, source.path) == ("hf.co/bartowski/SmolLM2-GGUF:Q4_K_M", blob)


def test_two_tags_of_one_blob_are_one_row(home):
    manifests = home / ".ollama/models/manifests/registry.ollama.ai/library/smollm2"
    write(manifests / "135m", ollama_manifest(f"sha256:{HEX}"))
    write(manifests / "latest", ollama_manifest(f"sha256:{HEX}"))
    write(home / f".ollama/models/blobs/sha256-{HEX}", gguf_bytes(64))
    assert [s.label for s in find_gguf_files()] == ["smollm2:135m"]


def test_hostile_manifests_and_paths_are_skipped(qtbot, settings, home, tmp_path):
    ollama = home / ".ollama/models"
    manifests = ollama / "manifests/registry.ollama.ai/library"
    outside = write(tmp_path / "outside" / f"sha256-{HEX}", gguf_bytes(64))  # a GGUF, elsewhere
    write(tmp_path / "outside/secret.json", ollama_manifest(f"sha256:{HEX}"))
    hostile = {
        "dotdot": ollama_manifest("sha256:../../../outside/sha256-" + HEX),
        "absolute": ollama_manifest(str(outside)),
        "absolute-digest": ollama_manifest(f"sha256:{outside}"),
        "not-hex": ollama_manifest("sha256:" + "zz" * 32),
        "short-hex": ollama_manifest("sha256:abc"),
        "trailing-newline": ollama_manifest(f"sha256:{HEX}\n"),
        "other-algorithm": ollama_manifest(f"md5:{HEX}"),
        "digest-not-text": json.dumps({"layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": [HEX]}]}),
        "layers-not-list": json.dumps({"layers": {"a": 1}}),
        "top-level-list": json.dumps([1, 2, 3]),
        "malformed": '{"layers": [ {"mediaType": ',
        "not-utf8": b"\xff\xfe\x00{",
        "nested": "[" * 100_000 + "]" * 100_000,
        "huge": json.dumps({"layers": [], "pad": "x" * (MAX_MANIFEST_BYTES + 1)}),
        "empty": "",
    }
    for i, (name, text) in enumerate(hostile.items()):
        write(manifests / name / f"tag{i}", text)
    # symlinks leading out: a manifest, a blob, and a whole LM Studio repo folder
    (manifests / "linked").mkdir()
    (manifests / "linked/latest").symlink_to(tmp_path / "outside/secret.json")
    blob_hex = "ef" * 32
    write(manifests / "linked-blob/latest", ollama_manifest(f"sha256:{blob_hex}"))
    (ollama / "blobs").mkdir(parents=True)
    (ollama / f"blobs/sha256-{blob_hex}").symlink_to(outside)
    lm = home / ".lmstudio/models/pub"
    lm.mkdir(parents=True)
    (lm / "escape").symlink_to(tmp_path / "outside")
    write(tmp_path / "outside/model.gguf", gguf_bytes(64))
    write(home / ".lmstudio/models/pub/repo/loop.gguf", b"")
    (home / ".lmstudio/models/pub/repo/loop.gguf").unlink()
    (home / ".lmstudio/models/pub/repo/loop.gguf").symlink_to("loop.gguf")  # a symlink loop
    if hasattr(os, "mkfifo"):
        os.mkfifo(home / ".lmstudio/models/pub/repo/fifo.gguf")  # reading it would block forever
    # a manifest named in the folder tree where a folder should be: wrong depth, skipped
    write(ollama / "manifests/registry.ollama.ai/flat", ollama_manifest(f"sha256:{HEX}"))
    # and one good model, so the listing is known to work at all
    write(manifests / "good/1b", ollama_manifest(f"sha256:{HEX}"))
    write(ollama / f"blobs/sha256-{HEX}", gguf_bytes(64))

    assert [s.label for s in find_gguf_files()] == ["good:1b"]
    dialog = ModelPickerDialog(settings)  # and the picker opens over all of it
    qtbot.addWidget(dialog)
    assert [r[0] for r in rows(dialog)] == ["good:1b"]


def test_no_folders_no_rows(qtbot, settings, home):
    dialog = ModelPickerDialog(settings)
    qtbot.addWidget(dialog)
    assert rows(dialog) == []
    assert dialog.gguf_import_panel.empty_label.isVisibleTo(dialog)
