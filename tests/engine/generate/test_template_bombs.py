"""Hostile chat templates: bounded in time and output, one clear bad-input sentence naming the
template, and cancel and a closed stdin still work while one renders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import pytest
from transformers import AutoTokenizer

from engine.events import BadRequest, GenerateRequest
from engine.generate.prompt import build, render_template
from engine.generate.template_guard import MAX_RENDER_S, RenderBudget, RenderCancelled
from tests.engine.helpers import REPO, WorkerProcess

R = "{% set r = range(100000) %}"
# no call and no output: no sandbox hook ever runs
SILENT = R + "{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}{% endfor %}"
BOMBS = {
    "silent loops": SILENT,
    "calls": R + "{% for a in r %}{% for b in r %}{{ 'x'|upper }}{% endfor %}{% endfor %}",
    "output": R + "{% for a in r %}{% for b in r %}{{ 'x' * 4096 }}{% endfor %}{% endfor %}",
    "macro": "{% macro m(n) %}{% for i in range(100000) %}{{ n }}{% endfor %}{% endmacro %}"
             + R + "{% for a in r %}{% set s = m(a) %}{% endfor %}",
}
BROKEN = {
    "sandbox": ("{{ [].append(1) }}", "SecurityError"),
    "raise": ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    "syntax": ("{% for %}", "TemplateSyntaxError"),
    "undefined": ("{{ nothing.at.all }}", "UndefinedError"),
}


@pytest.fixture(scope="module")
def bomb_model(tiny_model, tmp_path_factory):
    """The tiny model with the silent bomb as its template, in tokenizer_config.json."""
    folder = tmp_path_factory.mktemp("bomb") / "bomb-model"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = SILENT
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _with_template(tok, template):
    tok = AutoTokenizer.from_pretrained(tok.name_or_path)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_stops_at_the_bound_naming_the_template(tok, name):
    hostile = _with_template(tok, BOMBS[name])
    started = time.monotonic()
    with pytest.raises(BadRequest, match="chat template of .* and was stopped") as info:
        render_template(hostile, [{"role": "user", "content": "hi"}], RenderBudget(max_s=0.5))
    assert time.monotonic() - started < 2.5
    assert str(tok.name_or_path) in str(info.value)


@pytest.mark.parametrize("name", BROKEN)
def test_a_blocked_raising_or_broken_template_is_bad_input(tok, name):
    template, words = BROKEN[name]
    with pytest.raises(BadRequest, match="chat template of") as info:
        build(_with_template(tok, template), GenerateRequest(prompt="hi"), [], 2048)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_cancel_stops_a_rendering_bomb(tok):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(RenderCancelled):
        build(_with_template(tok, SILENT), GenerateRequest(prompt="hi"), [], 2048, cancel)
    assert time.monotonic() - started < 1.5


def test_a_real_template_renders_as_transformers_does_under_the_budget(tok):
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} é 😀"}
                for i in range(41)]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_template(tok, messages, RenderBudget()) == expected


def test_hearth_run_fails_within_the_bound_with_one_line(bomb_model):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "engine.serve.cli", "run", "--model",
                           str(bomb_model),
                           "--prompt", "hi", "--device", "cpu", "--max-new-tokens", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hearth:")]
    assert len(errors) == 1 and "chat template of" in errors[0] and str(bomb_model) in errors[0]
    assert "Traceback" not in proc.stderr
    assert elapsed < MAX_RENDER_S + 25  # the bound, plus importing torch and loading


def test_the_worker_answers_cancel_and_exits_on_closed_stdin_while_rendering(bomb_model):
    worker = WorkerProcess()
    try:
        worker.send(command="load", model=str(bomb_model), device="cpu")
        assert worker.stream()[-1].name == "loaded"
        worker.send(command="generate", prompt="hi", max_new_tokens=2)
        time.sleep(0.5)  # rendering now
        started = time.monotonic()
        worker.send(command="cancel")
        events = worker.stream()
        assert time.monotonic() - started < 2
        assert [e.name for e in events] == ["finished"] and events[0].reason == "cancelled"

        worker.send(command="generate", prompt="hi", max_new_tokens=2)
        time.sleep(0.5)
        started = time.monotonic()
        worker.proc.stdin.close()
        assert worker.proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 2
    finally:
        worker.proc.kill()
        worker.proc.wait()
