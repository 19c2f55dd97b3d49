"""Conversation Settings shows, greyed, the sampling the engine really uses for the loaded model
where the conversation leaves a setting unset: the window's real worker loads a model, and the
dialog's values equal those of the Sampler the engine builds for an unset request on that
model. A setting the user never ticks stays unset (the model's default)."""

from __future__ import annotations

import json
import shutil

import pytest

from app.chat.conversation_settings_dialog import (
    RANDOM_SEED,
    UNKNOWN_DEFAULT,
    ConversationSettingsDialog,
)
from app.history.conversation import ChatSettings
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest

pytest.importorskip("torch")  # the engine's side; the app itself never imports it

SETTINGS = ("temperature", "top_p", "top_k", "repetition_penalty")


@pytest.fixture
def model_folder(tiny_models, tmp_path):
    """A Llama whose generation_config.json names some settings: the others come from the
    Llama preset (top_p) and the engine (the penalty)."""
    folder = shutil.copytree(tiny_models["llama"], tmp_path / "llama")
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(do_sample=True, temperature=0.35, top_k=30)
    (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


def engine_sampling(folder) -> dict:
    """What the engine's Sampler uses for a request that sets nothing, on this model."""
    from engine.events import GenerateRequest
    from engine.generate.generation import checked_prompt
    from engine.generate.session import Session

    session = Session.load(LoadRequest(str(folder), device="cpu", context=128))
    sampler = checked_prompt(session.lm, GenerateRequest(prompt="hi"), []).sampler
    return {k: getattr(sampler.s, k) for k in SETTINGS}


def open_dialog(window) -> ConversationSettingsDialog:
    window.chat_view.settings_button.click()
    return window.findChild(ConversationSettingsDialog)


def test_the_dialog_shows_what_the_sampler_uses(qtbot, store, settings, model_folder):
    from app.main_window import MainWindow

    worker = WorkerClient()  # the real worker: python -m engine.cli.worker
    window = MainWindow(store, worker, settings)
    qtbot.addWidget(window)
    try:
        window.show()
        with qtbot.waitSignal(worker.sig_loaded, timeout=120_000):
            window.start(LoadRequest(model=str(model_folder), device="cpu", context=128))
        dialog = open_dialog(window)
        shown = {}
        for name, (box, spin) in dialog.overrides.items():
            assert not box.isChecked() and not spin.isEnabled()  # a new conversation sets none
            shown[name] = spin.value()
        used = engine_sampling(model_folder)
        assert {k: shown[k] for k in SETTINGS} == pytest.approx(used)
        assert used == pytest.approx({"temperature": 0.35, "top_p": 0.9, "top_k": 30,
                                      "repetition_penalty": 1.0})
        assert dialog.overrides["seed"][1].text() == RANDOM_SEED  # a new seed each answer
        assert "generation_config.json" in dialog.defaults_label.text()
        # untouched, it stays unset: the model's default, whatever model comes next
        dialog.accept()
        saved = store.conversation(window.controller.conversation.id).settings
        assert all(getattr(saved, name) is None for name in dialog.overrides)
    finally:
        worker.kill()
        window.close()


def test_ticking_starts_from_the_default_and_unticking_shows_it_again(qtbot, store):
    conversation = store.create_conversation("c", ChatSettings())
    defaults = {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.0,
                "source": "the Llama family's preset"}
    dialog = ConversationSettingsDialog(conversation, defaults=defaults)
    qtbot.addWidget(dialog)
    box, spin = dialog.overrides["temperature"]
    box.setChecked(True)
    assert spin.isEnabled() and spin.value() == 0.2
    spin.setValue(0.5)
    assert dialog.settings().temperature == 0.5 and dialog.settings().top_p is None
    box.setChecked(False)
    assert not spin.isEnabled() and spin.value() == 0.2
    assert dialog.settings().temperature is None


def test_unknown_defaults_say_so_instead_of_a_number(qtbot, store):
    """No model, or an endpoint's (its Loaded carries no sampling): no made-up numbers."""
    conversation = store.create_conversation("c", ChatSettings())
    dialog = ConversationSettingsDialog(conversation, defaults={})
    qtbot.addWidget(dialog)
    box, spin = dialog.overrides["temperature"]
    assert spin.text() == UNKNOWN_DEFAULT
    box.setChecked(True)  # a value of the user's own: a number, not the words
    assert spin.text() != UNKNOWN_DEFAULT and dialog.settings().temperature == spin.value()
    box.setChecked(False)
    assert spin.text() == UNKNOWN_DEFAULT and dialog.settings().temperature is None
