"""A hostile Hub (fake_hub.py told to lie): traversing commit ids, file names and ETags, streams
longer than declared or endless, no size, a wrong hash. Each case ends in one sentence in the
Get a model panel, and nothing outside the repo's cache folder is written or linked to."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.get_model.get_model_panel import GetModelPanel
from app.get_model.model_download import ModelDownload
from app.models import model_catalog
from engine.files import hub_download, hub_listing, model_folder
from engine.files.hub_listing import HubError, fetch_listing, parse_repo_id
from tests.app.fake_hub import ENDLESS, Lie, folder_files, serving

REPO = "hearth-test/tiny-qwen2"
GIT_BLOB_ID = "0123456789abcdef0123456789abcdef01234567"  # an ETag of the shape of a git blob id


@pytest.fixture
def hub(tiny_model, monkeypatch):
    with serving({REPO: folder_files(tiny_model)}, monkeypatch) as fake:
        yield fake


@pytest.fixture
def cache(tmp_path):
    cache = tmp_path / "hub"  # HF_HUB_CACHE (tests/app/conftest.py)
    cache.mkdir()
    return cache


@pytest.fixture
def victim(tmp_path):
    """A file of the user's beside the cache, which a traversing path would reach."""
    path = tmp_path / "outside" / "secret.safetensors"
    path.parent.mkdir()
    path.write_bytes(b"the user's own bytes")
    return path


def tree(root: Path) -> dict[str, object]:
    """Every entry under root (links not followed): its link target, bytes, or 'dir'."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            found[str(path.relative_to(root))] = (
                ("link", os.readlink(path)) if path.is_symlink()
                else "dir" if path.is_dir() else path.read_bytes())
    return found


def outside(entries: dict[str, object], target: str) -> dict[str, object]:
    return {k: v for k, v in entries.items() if k != target and not k.startswith(target + "/")}


def links_leaving(folder: Path) -> list[Path]:
    if not folder.exists():
        return []
    return [p for p in folder.rglob("*")
            if p.is_symlink() and not p.resolve().is_relative_to(folder.resolve())]


def set_lie(name: str, **lie):
    return lambda hub, _tmp: hub.lies.__setitem__(name, Lie(**lie))


def set_commit(commit: str):
    return lambda hub, _tmp: setattr(hub, "commit_id", commit)


def add_file(name: str):
    def add(hub, tmp):
        hub.repos[REPO][name.format(tmp=str(tmp).lstrip("/"))] = b"\x00" * 64
    return add


def endless_listing(hub, _tmp):
    hub.endless_listing = True


def wrong_bytes(hub, _tmp):
    """The same length as the real file, every byte different: only the sha256 tells."""
    data = hub.repos[REPO]["model.safetensors"]
    hub.lies["model.safetensors"] = Lie(body=bytes(b ^ 1 for b in data))


def etag_to_victim(hub, tmp):
    hub.lies["model.safetensors"] = Lie(etag=str(tmp / "outside" / "secret.safetensors"))


CASES = {
    "commit that climbs out": (set_commit("../../../escaped"), "is not a commit id"),
    "commit in capitals": (set_commit("ABCDEF0123" * 4), "is not a commit id"),
    "commit with a newline": (set_commit("abcdef0123" * 4 + "\n"), "is not a commit id"),
    "name with ..": (add_file("../../../escaped.safetensors"), "outside the model's folder"),
    "name with backslashes": (add_file("..\\..\\..\\escaped.safetensors"),
                              "outside the model's folder"),
    "absolute name": (add_file("/{tmp}/outside/absolute.safetensors"),
                      "outside the model's folder"),
    "name with a drive": (add_file("C:escaped.safetensors"), "outside the model's folder"),
    "name with an empty segment": (add_file("sub//escaped.safetensors"),
                                   "outside the model's folder"),
    "ETag that climbs to a file": (set_lie("model.safetensors",
                                           etag="../../../outside/secret.safetensors"),
                                   "is not a file hash"),
    "absolute ETag": (etag_to_victim, "is not a file hash"),
    "ETag of a small file": (set_lie("tokenizer.json", etag="../escaped"), "is not a file hash"),
    "longer than declared": (set_lie("model.safetensors", size=100),
                             "kept coming past the 100 bytes declared"),
    "endless with a size": (set_lie("model.safetensors", body=ENDLESS),
                            "bytes declared, so it was stopped and deleted"),
    "no size and no hash": (set_lie("model.safetensors", no_size=True, etag=GIT_BLOB_ID),
                            "gives neither its size nor its sha256"),
    "wrong hash": (wrong_bytes, "arrived with the wrong sha256"),
    "endless small file": (set_lie("tokenizer.json", no_size=True, body=ENDLESS),
                           "allowed for a file of unknown size"),
    "endless weight known by hash": (set_lie("model.safetensors", no_size=True, body=ENDLESS),
                                     "bytes the disk can take while leaving"),
    "endless weight announcing a size": (set_lie("model.safetensors", no_size=True,
                                                 body=ENDLESS, announced=1 << 20),
                                         "arrived with the wrong sha256"),
    "weight announcing more than the disk": (set_lie("model.safetensors", no_size=True,
                                                     body=ENDLESS, announced=1 << 40),
                                             "more than the disk of"),
    "negative size": (set_lie("config.json", size=-5), "is not a byte count"),
    "endless listing": (endless_listing, "is larger than"),
    "endless config.json": (set_lie("config.json", body=ENDLESS), "is larger than"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_hub_ends_in_one_sentence_and_writes_nothing_outside(
        case, qtbot, hub, cache, tmp_path, victim, monkeypatch):
    lie, words = CASES[case]
    lie(hub, tmp_path)
    # small bounds keep the endless cases fast; the bounds themselves are what is tested
    monkeypatch.setattr(hub_download, "MAX_UNDECLARED_BYTES", 1 << 20)
    monkeypatch.setattr(hub_listing, "MAX_LISTING_BYTES", 1 << 20)
    monkeypatch.setattr(hub_download, "free_bytes",
                        lambda _folder: hub_download.DISK_MARGIN_BYTES + (8 << 20))
    before = tree(tmp_path)
    download = ModelDownload(cache)
    panel = GetModelPanel(download)
    qtbot.addWidget(panel)
    failed, downloaded = [], []
    download.sig_failed.connect(failed.append)
    download.sig_downloaded.connect(downloaded.append)

    panel.repo_edit.setText(REPO)
    with qtbot.waitSignal(download.sig_busy_changed, timeout=10_000,
                          check_params_cb=lambda busy: not busy):
        panel.check_button.click()
    if not failed:
        with qtbot.waitSignal(download.sig_busy_changed, timeout=20_000,
                              check_params_cb=lambda busy: not busy):
            panel.download_button.click()

    assert not downloaded
    [message] = failed
    assert words in message
    assert "\n" not in message and not message.startswith("unexpected")
    assert words in panel.info_label.text()
    target = "hub/models--hearth-test--tiny-qwen2"
    assert outside(tree(tmp_path), target) == outside(before, target)
    assert not links_leaving(tmp_path / target)
    assert not hub_download.partial_files(cache, REPO)  # what broke a promise is deleted
    assert not (tmp_path / target / "refs" / "main").exists()


def test_a_wrong_hash_is_a_hub_error_and_the_partial_is_deleted(hub, cache):
    data = hub.repos[REPO]["model.safetensors"]
    hub.lies["model.safetensors"] = Lie(body=bytes(reversed(data)))
    listing = fetch_listing(REPO)
    with pytest.raises(HubError, match="model.safetensors arrived with the wrong sha256"):
        hub_download.download(listing, cache, lambda _p: None, lambda: False)
    assert not any((hub_download.repo_folder(cache, REPO) / "blobs").iterdir())
    hub.lies.clear()  # the next try starts over and succeeds
    snapshot = hub_download.download(listing, cache, lambda _p: None, lambda: False)
    assert (snapshot / "model.safetensors").read_bytes() == data


def test_a_weight_known_only_by_its_hash_downloads(hub, cache, tiny_model):
    hub.lies["model.safetensors"] = Lie(no_size=True)  # the ETag (its sha256) still checks it
    listing = fetch_listing(REPO)
    snapshot = hub_download.download(listing, cache, lambda _p: None, lambda: False)
    assert folder_files(snapshot) == folder_files(tiny_model)


def download_recording_progress(listing, cache, name: str = "model.safetensors") -> list[int]:
    """Download; how many bytes of `name` had arrived at each progress report (a HubError
    propagates with them in its `seen` attribute)."""
    reports = []
    try:
        hub_download.download(listing, cache, reports.append, lambda: False)
    except HubError as e:
        e.seen = _bytes_of(reports, name)
        raise
    return _bytes_of(reports, name)


def _bytes_of(reports, name: str) -> list[int]:
    """A report's done_bytes counts the files before too: the first report of a file is at 0."""
    done = [p.done_bytes for p in reports if p.file_name == name]
    return [d - done[0] for d in done] if done else [0]


def test_a_weight_known_only_by_its_hash_stops_at_the_disk_margin(hub, cache, monkeypatch):
    """No size anywhere and an endless body: the stream stops where the disk would keep only
    its margin free, well before the disk is full, and the partial is deleted."""
    room = 3 << 20
    hub.lies["model.safetensors"] = Lie(no_size=True, body=ENDLESS)
    monkeypatch.setattr(hub_download, "free_bytes",
                        lambda _folder: hub_download.DISK_MARGIN_BYTES + room)
    listing = fetch_listing(REPO)
    with pytest.raises(HubError) as raised:
        download_recording_progress(listing, cache)
    message = str(raised.value)
    assert message.startswith("model.safetensors kept coming past the 3,145,728 bytes the disk "
                              "can take while leaving 1.0 GB free")
    assert "\n" not in message
    assert max(raised.value.seen) <= room  # never a byte past the room
    assert not hub_download.partial_files(cache, REPO)
    assert not list((hub_download.repo_folder(cache, REPO) / "blobs").iterdir())


def test_a_weight_announced_larger_than_the_disk_is_refused_before_a_byte(hub, cache,
                                                                         monkeypatch):
    hub.lies["model.safetensors"] = Lie(no_size=True, body=ENDLESS, announced=50 << 30)
    monkeypatch.setattr(hub_download, "free_bytes",
                        lambda _folder: hub_download.DISK_MARGIN_BYTES + (3 << 20))
    listing = fetch_listing(REPO)
    with pytest.raises(HubError, match=r"^model.safetensors is 53.7 GB, more than the disk of "
                                       r".* can take while leaving 1.0 GB free") as raised:
        download_recording_progress(listing, cache)
    assert max(raised.value.seen) == 0
    assert not list((hub_download.repo_folder(cache, REPO) / "blobs").iterdir())


def test_a_weight_known_by_hash_stops_at_the_length_its_response_announces(hub, cache,
                                                                         monkeypatch):
    """An endless body that announces 1 MiB: 1 MiB is read, the hash does not match, and the
    partial is deleted; the disk's room (plenty) plays no part."""
    hub.lies["model.safetensors"] = Lie(no_size=True, body=ENDLESS, announced=1 << 20)
    monkeypatch.setattr(hub_download, "free_bytes",
                        lambda _folder: hub_download.DISK_MARGIN_BYTES + (64 << 20))
    listing = fetch_listing(REPO)
    with pytest.raises(HubError, match="^model.safetensors arrived with the wrong sha256"
                       ) as raised:
        download_recording_progress(listing, cache)
    assert max(raised.value.seen) == 1 << 20
    assert not hub_download.partial_files(cache, REPO)


def test_a_listing_made_by_hand_is_checked_too(hub, cache, tmp_path):
    listing = fetch_listing(REPO)
    for bad in ({"commit": "../../../escaped"},
                {"files": (hub_listing.RepoFile("../escaped.json", 10),)},
                {"repo_id": "../escaped"}):
        with pytest.raises(HubError):
            hub_download.download(SimpleNamespace(**{**listing.__dict__, **bad,
                                                     "total_bytes": 10}),
                                  cache, lambda _p: None, lambda: False)
    assert not (tmp_path / "escaped").exists() and not (cache / "escaped.json").exists()


@pytest.mark.parametrize("text", ["org--x/name", "org/na--me", "org/..", "../name", "org/näme",
                                  "org/name.", "-org/name", "o" * 97 + "/name"])
def test_repo_ids_the_hub_never_gives_are_refused(text):
    with pytest.raises(HubError, match="is not a Hugging Face repo id"):
        parse_repo_id(text)


def test_a_refs_main_that_is_a_path_is_never_followed(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    repo = hub_download.repo_folder(cache, REPO)
    own = repo / "snapshots" / ("ab" * 20)
    own.mkdir(parents=True)
    (own / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("../../../elsewhere")
    assert (repo / "snapshots" / "../../../elsewhere").resolve() == elsewhere.resolve()

    [entry] = model_catalog.hub_entries(cache)
    assert entry.folder == own
    assert model_folder.resolve(REPO) == own  # HF_HUB_CACHE is this cache (tests/app/conftest)


def test_what_a_server_sends_shows_as_text_never_as_markup(qtbot, cache):
    download = ModelDownload(cache)
    panel = GetModelPanel(download)
    qtbot.addWidget(panel)
    listing = hub_listing.RepoListing(
        REPO, "ab" * 20, (hub_listing.RepoFile("<img src=x>.safetensors", 10),), 0,
        {"architectures": ["<b>Evil</b>ForCausalLM"]})
    panel._on_download_listed(listing)
    assert "&lt;img src=x&gt;.safetensors" in panel.info_label.text()
    assert "&lt;b&gt;Evil&lt;/b&gt;ForCausalLM is not an architecture" in panel.info_label.text()
    panel._on_download_failed("<a href='x'>model.safetensors</a> arrived broken")
    assert "&lt;a href='x'&gt;model.safetensors&lt;/a&gt; arrived" in panel.info_label.text()
