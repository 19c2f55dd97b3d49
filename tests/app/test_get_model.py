"""Get a model: check a Hub repo (size, files, fit) before downloading, download only what
Hearth loads, cancel and resume, then pick it. Against a fake Hub on localhost (fake_hub.py),
with HF_ENDPOINT pointed at it: no test here touches the network."""

from __future__ import annotations

import os

import huggingface_hub.constants
import pytest
from PySide6.QtCore import Qt

from app.get_model.get_model_panel import size_text
from app.models.model_picker_dialog import ENTRY_ROLE, ModelPickerDialog
from engine.files import hub_download, model_folder
from engine.files.hub_download import DownloadCancelled
from engine.files.hub_listing import HubError, fetch_listing
from tests.app.fake_hub import folder_files, serving
from tests.app.test_model_picker import card

REPO = "hearth-test/tiny-qwen2"
EXTRAS = {"pytorch_model.bin": b"\x80" * 4000, "onnx/model.onnx": b"o" * 3000,
          "README.md": b"# tiny\n"}


@pytest.fixture
def fake_hub(tiny_model, monkeypatch):
    repos = {REPO: {**folder_files(tiny_model), **EXTRAS},
             "hearth-test/pickles": {"config.json": b"{}", "pytorch_model.bin": b"\x80" * 10}}
    with serving(repos, monkeypatch, gated=("hearth-test/gated",)) as hub:
        yield hub


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "hub"  # HF_HUB_CACHE (tests/app/conftest.py)


def test_a_listing_gives_size_and_files_before_anything_is_downloaded(fake_hub, tiny_model,
                                                                       cache):
    listing = fetch_listing(f"https://huggingface.co/{REPO}")  # a page address works too
    names = [f.name for f in listing.files]
    assert names[0] == "model.safetensors" and names[-1] == "config.json"
    assert set(names) == {p.name for p in tiny_model.iterdir()}
    assert listing.num_skipped_files == len(EXTRAS)
    assert listing.total_bytes == sum(p.stat().st_size for p in tiny_model.iterdir())
    assert listing.config["model_type"] == "qwen2" and listing.is_supported
    assert listing.commit == fake_hub.commit(REPO)
    assert not cache.exists()  # looking downloads nothing


@pytest.mark.parametrize(("repo", "words"), [
    ("hearth-test/missing", "there is no model hearth-test/missing on 127.0.0.1"),
    ("hearth-test/gated", "is gated: accept its terms"),
    ("hearth-test/pickles", "has no safetensors weights (only pytorch_model.bin)"),
    ("not a repo", "is not a Hugging Face repo id"),
])
def test_a_repo_that_cannot_be_had_is_explained(fake_hub, repo, words):
    with pytest.raises(HubError, match=None) as error:
        fetch_listing(repo)
    assert words in str(error.value)


def test_an_unreachable_hub_is_explained(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(HubError, match="could not reach 127.0.0.1:9"):
        fetch_listing(REPO)


def test_a_cancelled_download_resumes_where_it_stopped(fake_hub, tiny_model, cache,
                                                       monkeypatch):
    monkeypatch.setattr(hub_download, "CHUNK_BYTES", 64 * 1024)
    listing = fetch_listing(REPO)
    seen = []
    with pytest.raises(DownloadCancelled):
        hub_download.download(listing, cache, seen.append,
                              lambda: bool(seen) and seen[-1].done_bytes > 0)
    [partial] = hub_download.partial_files(cache, REPO)
    kept = partial.stat().st_size
    assert 0 < kept < (tiny_model / "model.safetensors").stat().st_size

    snapshot = hub_download.download(listing, cache, seen.append, lambda: False)
    assert ("GET", partial.name.removesuffix(".incomplete"), f"bytes={kept}-") in [
        (m, p.rsplit("/", 1)[-1], r) for m, p, r in fake_hub.requests]
    assert folder_files(snapshot) == folder_files(tiny_model)
    assert (snapshot / "model.safetensors").is_symlink()
    assert not hub_download.partial_files(cache, REPO)
    assert seen[-1].done_bytes == seen[-1].total_bytes == listing.total_bytes
    # the engine finds it by repo id in the cache, as it finds anything `hf download` put there
    assert model_folder.check(REPO).path == snapshot

    num_requests = len(fake_hub.requests)
    hub_download.download(listing, cache, seen.append, lambda: False)  # all there: no bodies
    assert all(m == "HEAD" for m, _p, _r in fake_hub.requests[num_requests:])


def pick_repo(qtbot, dialog, repo: str) -> None:
    """Type the repo id and press Return: it is checked, and the dialog stays open."""
    panel = dialog.get_model_panel
    dialog.show()
    panel.repo_edit.setText(repo)
    with qtbot.waitSignal(dialog.download.sig_listed, timeout=10_000):
        qtbot.keyClick(panel.repo_edit, Qt.Key.Key_Return)
    assert dialog.isVisible() and dialog.result() == 0


def test_the_picker_shows_the_fit_downloads_and_lists_the_model(qtbot, settings, fake_hub,
                                                                 cache, tiny_model):
    dialog = ModelPickerDialog(settings, card(8), hub=cache)
    qtbot.addWidget(dialog)
    pick_repo(qtbot, dialog, REPO)
    panel, fit = dialog.get_model_panel, dialog.fit_panel
    total = size_text(sum(p.stat().st_size for p in tiny_model.iterdir()))
    assert f"{REPO}</b>: {total} to download in 6 files: model.safetensors (" in \
        panel.info_label.text()
    assert "3 other files (other formats) are left out" in panel.info_label.text()
    assert REPO in fit.summary_label.text() and "On the Hub, not downloaded" in \
        fit.summary_label.text()
    assert fit.fit_table.rowCount() == 5 and fit.verdict_label.text().endswith(": fits.")
    assert not dialog.load_button.isEnabled()  # download first
    assert panel.download_button.isEnabled()

    with qtbot.waitSignal(dialog.download.sig_downloaded, timeout=10_000):
        panel.download_button.click()
    entry = dialog.selected_entry()
    assert (entry.source, entry.load_name) == ("hub", REPO)
    assert dialog.load_button.isEnabled()
    assert dialog.load_request().model == REPO
    assert panel.progress_bar.value() == 1000 and "Downloaded" in panel.info_label.text()


def test_cancel_in_the_picker_keeps_what_arrived(qtbot, settings, fake_hub, cache, monkeypatch):
    monkeypatch.setattr(hub_download, "CHUNK_BYTES", 16 * 1024)
    fake_hub.seconds_per_chunk = 0.01
    dialog = ModelPickerDialog(settings, card(8), hub=cache)
    qtbot.addWidget(dialog)
    pick_repo(qtbot, dialog, REPO)
    panel = dialog.get_model_panel
    with qtbot.waitSignal(dialog.download.sig_progress, timeout=10_000,
                          check_params_cb=lambda p: p.done_bytes > 0):
        panel.download_button.click()
    assert panel.cancel_button.isEnabled() and not panel.check_button.isEnabled()
    assert "Downloading hearth-test/tiny-qwen2" in panel.info_label.text()
    with qtbot.waitSignal(dialog.download.sig_cancelled, timeout=10_000):
        panel.cancel_button.click()
    assert hub_download.partial_files(cache, REPO)
    assert "what arrived is kept" in panel.info_label.text().lower()
    listed = [dialog.model_list.item(i).data(ENTRY_ROLE) for i in range(dialog.model_list.count())]
    assert REPO not in [e.load_name for e in listed]  # a partial download is not a model

    fake_hub.seconds_per_chunk = 0.0
    with qtbot.waitSignal(dialog.download.sig_downloaded, timeout=10_000):
        panel.download_button.click()
    assert any(r and r != "bytes=0-" for _m, _p, r in fake_hub.requests)  # resumed by Range
    assert dialog.selected_entry().load_name == REPO
    assert os.listdir(cache / "models--hearth-test--tiny-qwen2" / "refs") == ["main"]


def test_a_full_disk_is_refused_before_downloading(fake_hub, cache, monkeypatch):
    listing = fetch_listing(REPO)
    monkeypatch.setattr(hub_download, "free_bytes", lambda _folder: 1000)
    with pytest.raises(HubError, match="needs 0.0 GB more disk space; .* has 0.0 GB free"):
        hub_download.download(listing, cache, lambda _p: None, lambda: False)
    assert not any(m == "GET" and "/cdn/" in p for m, p, _r in fake_hub.requests)
