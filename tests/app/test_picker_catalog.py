"""The picker as a catalogue: each model with its size on disk, parameters, architecture and
formats; a search box; fp16 in the fit table; a folder without config.json refused with the
reason; and Hub search by keyword in Get a model (against the fake Hub), with downloads and size
per result and the fit per format before downloading."""

from __future__ import annotations

import json

import pytest

from app.get_model.hub_search import search_models
from app.models.model_picker_dialog import ModelPickerDialog
from engine.files.hub_listing import HubError
from tests.app import test_get_model, test_model_picker
from tests.app.fake_hub import folder_files
from tests.app.test_get_model import REPO
from tests.app.test_model_picker import card

hub = test_model_picker.hub  # the fixtures, shared
fake_hub = test_get_model.fake_hub


def items(dialog) -> list[str]:
    return [dialog.model_list.item(i).text() for i in range(dialog.model_list.count())]


def shown(dialog) -> list[str]:
    return [dialog.model_list.item(i).text().split("\n")[0]
            for i in range(dialog.model_list.count()) if not dialog.model_list.item(i).isHidden()]


def test_each_model_is_listed_with_size_parameters_architecture_and_formats(qtbot, settings,
                                                                            hub):
    dialog = ModelPickerDialog(settings, card(8), hub=hub)
    qtbot.addWidget(dialog)
    [demo] = [t for t in items(dialog) if t.startswith("Demo model")]
    name, facts = demo.split("\n")
    size, params, arch, formats = facts.split(" · ")
    assert size.endswith(" MB on disk") and float(size.split()[0]) > 1  # the safetensors file
    assert (params, arch, formats) == ("5M parameters", "qwen2", "bf16")
    [qwen] = [t for t in items(dialog) if "Qwen2.5-7B" in t]
    # a config.json alone: no weights on disk, the parameters from the shapes
    assert qwen.split("\n")[1] == "357 B on disk · 7.6B parameters · qwen2 · bf16"


def test_the_search_box_filters_the_list(qtbot, settings, hub):
    dialog = ModelPickerDialog(settings, card(8), hub=hub)
    qtbot.addWidget(dialog)
    everything = shown(dialog)
    assert len(everything) >= 2
    dialog.search_edit.setText("qwen2.5 INSTRUCT")
    assert shown(dialog) == ["Qwen/Qwen2.5-7B-Instruct  (hub)"]
    dialog.search_edit.setText("7.6B")  # the facts line is searched too
    assert shown(dialog) == ["Qwen/Qwen2.5-7B-Instruct  (hub)"]
    dialog.search_edit.setText("no such model")
    assert shown(dialog) == []
    dialog.search_edit.clear()
    assert shown(dialog) == everything


def test_fp16_is_in_the_fit_table(qtbot, settings, hub):
    dialog = ModelPickerDialog(settings, card(24), hub=hub)
    qtbot.addWidget(dialog)
    [row] = [i for i in range(dialog.model_list.count())
             if "Qwen2.5-7B" in dialog.model_list.item(i).text()]
    dialog.model_list.setCurrentRow(row)
    table = dialog.fit_panel.fit_table
    formats = [table.item(r, 0).text() for r in range(table.rowCount())]
    assert formats == ["bf16", "fp16", "int8", "nf4", "awq"]
    assert table.item(1, 4).text() == "yes"  # 7B in fp16 on 24 GiB


@pytest.mark.parametrize("kind", ["empty", "gguf", "missing"])
def test_a_folder_without_config_json_is_refused_with_the_reason(qtbot, settings, hub,
                                                                  tmp_path, kind):
    folder = tmp_path / "not-a-model"
    if kind != "missing":
        folder.mkdir()
    if kind == "gguf":
        (folder / "tiny.Q4_K_M.gguf").write_bytes(b"GGUF")
    dialog = ModelPickerDialog(settings, card(8), hub=hub)
    qtbot.addWidget(dialog)
    before = items(dialog)
    assert dialog.add_folder(folder) is False
    assert settings.model_folders() == []  # not remembered
    assert items(dialog) == before  # not listed
    summary = dialog.fit_panel.summary_label.text()
    assert f"{folder} has no config.json" in summary and "was not added" in summary
    assert ("tiny.Q4_K_M.gguf: import GGUF files below" in summary) == (kind == "gguf")
    assert dialog.selected_entry() is None and not dialog.load_button.isEnabled()
    assert dialog.load_request() is None


def test_search_models_reads_the_hubs_answer_and_skips_what_is_malformed(fake_hub):
    fake_hub.repos["hearth-test/tiny-llama"] = {"config.json": b"{}"}
    fake_hub.downloads = {REPO: 1_250_000, "hearth-test/tiny-llama": 30}
    found = search_models("  TINY  ")
    assert [m.repo_id for m in found] == [REPO, "hearth-test/tiny-llama"]  # most downloaded
    assert found[0].downloads == 1_250_000 and found[0].dtypes == ("BF16",)
    weights = len(fake_hub.repos[REPO]["model.safetensors"])
    assert found[0].weights_bytes == weights // 2 * 2 and found[0].num_params == weights // 2
    fake_hub.search_answer = json.dumps([
        {"id": "../../etc"}, {"id": "a--b/c"}, "junk", {"id": "ok/model", "downloads": -5,
                                                       "safetensors": {"parameters": {"F32": 10,
                                                                                      "BF16": "x"}}}
    ]).encode()
    [ok] = search_models("anything")
    assert (ok.repo_id, ok.downloads, ok.weights_bytes, ok.dtypes) == ("ok/model", 0, 40, ("F32",))
    fake_hub.search_answer = b'{"error": "not a list"}'
    with pytest.raises(HubError, match="not a list"):
        search_models("anything")
    with pytest.raises(HubError, match="at most 100 characters"):
        search_models("x" * 101)


def test_get_a_model_searches_the_hub_by_keyword(qtbot, settings, fake_hub, tiny_model,
                                                 tmp_path):
    fake_hub.repos["hearth-test/tiny-qwen2-chat"] = folder_files(tiny_model)
    fake_hub.repos["someone/unrelated"] = {"config.json": b"{}"}
    fake_hub.downloads = {REPO: 5_000, "hearth-test/tiny-qwen2-chat": 120_000}
    dialog = ModelPickerDialog(settings, card(8), hub=tmp_path / "hub")
    qtbot.addWidget(dialog)
    panel = dialog.get_model_panel
    panel.repo_edit.setText("tiny qwen2")
    assert panel.check_button.text() == "Search"
    with qtbot.waitSignal(dialog.download.sig_found, timeout=10_000):
        panel.check_button.click()
    assert panel.results.isVisibleTo(panel) and panel.results.count() == 2
    first = panel.results.item(0).text()
    assert first.startswith("hearth-test/tiny-qwen2-chat · 120k downloads · ")
    assert " parameters · " in first and " in BF16" in first
    assert panel.results.item(1).text().startswith(f"{REPO} · 5k downloads")
    assert "2 models with safetensors weights match tiny qwen2" in panel.info_label.text()
    assert not dialog.download.listing  # nothing checked, nothing downloaded yet

    with qtbot.waitSignal(dialog.download.sig_listed, timeout=10_000):
        panel.results.itemClicked.emit(panel.results.item(1))
    assert dialog.download.listing.repo_id == REPO
    fit = dialog.fit_panel
    assert REPO in fit.summary_label.text() and "On the Hub, not downloaded" in \
        fit.summary_label.text()
    formats = [fit.fit_table.item(r, 0).text() for r in range(fit.fit_table.rowCount())]
    assert formats == ["bf16", "fp16", "int8", "nf4", "awq"]  # the fit per format, beforehand
    assert panel.download_button.isEnabled()
    assert not (tmp_path / "hub").exists()  # a search and a check download nothing

    panel.repo_edit.setText(REPO)
    assert panel.check_button.text() == "Check"  # a repo id is checked, not searched
    panel.repo_edit.setText("nothing matches this")
    with qtbot.waitSignal(dialog.download.sig_found, timeout=10_000):
        panel.check_button.click()
    assert not panel.results.isVisibleTo(panel)
    assert "No model with safetensors weights on the Hub matches" in panel.info_label.text()
