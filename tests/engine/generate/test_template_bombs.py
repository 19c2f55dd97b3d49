"""Hostile chat templates: stopped at their bound with one clear bad-input sentence naming the
template, whatever they cost (Python-level loops or one C-level operation holding the GIL), and
the process answers again afterwards; cancel and a closed stdin still work while one renders.

No assertion here measures speed: a bomb left alone runs for hours, so a generous hang guard
tells "stopped" from "not stopped" on however busy a machine.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from transformers import AutoTokenizer

from engine.cli import cli
from engine.events import BadRequest, GenerateRequest
from engine.files.tokenizer_files import MAX_TEMPLATE_CHARS
from engine.generate.prompt import build, render_template
from engine.generate.template_guard import RenderBudget, RenderCancelled
from tests.engine.helpers import WorkerProcess, hearth_serve

HANG_GUARD_S = 180  # a stopped bomb ends in seconds; one not stopped runs for hours
R = "{% set r = range(100000) %}"
# no call and no output: no sandbox hook ever runs
SILENT = R + "{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}{% endfor %}"
# one C-level operation over a variable (not folded at compile time): hours, holding the GIL
POWER = "{% set n = messages|length + 8 %}{{ n ** (n ** n) }}"
BOMBS = {
    "silent loops": SILENT,
    "calls": R + "{% for a in r %}{% for b in r %}{{ 'x'|upper }}{% endfor %}{% endfor %}",
    "output": R + "{% for a in r %}{% for b in r %}{{ 'x' * 4096 }}{% endfor %}{% endfor %}",
    "macro": "{% macro m(n) %}{% for i in range(100000) %}{{ n }}{% endfor %}{% endmacro %}"
             + R + "{% for a in r %}{% set s = m(a) %}{% endfor %}",
    "constant power": "{{ 9 ** (9 ** 9) }}",  # jinja folds constants: this one is in compiling
    "power of a variable": POWER,
    "string growth": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "list growth": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                   "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    "repetition": "{{ messages[0].content * 10 ** 12 }}",
    "width": "{{ messages[0].content.center(10 ** 12) }}",
}
BROKEN = {
    "sandbox": ("{{ [].append(1) }}", "SecurityError"),
    "raise": ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    "syntax": ("{% for %}", "TemplateSyntaxError"),
    "undefined": ("{{ nothing.at.all }}", "UndefinedError"),
}
HI = [{"role": "user", "content": "hi"}]


def finishes(fn, *args):
    """fn(*args), on a thread this test waits for no longer than the hang guard."""
    box = {}

    def call():
        try:
            box["value"] = fn(*args)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"{fn.__name__} still running after {HANG_GUARD_S} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _model_with_template(source, parent, template: str):
    """A copy of the tiny model whose only chat template is `template`, in tokenizer_config."""
    folder = parent / "bomb-model"
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def bomb_model(tiny_model, tmp_path_factory):
    return _model_with_template(tiny_model, tmp_path_factory.mktemp("bomb"), POWER)


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _with_template(tok, template):
    tok = AutoTokenizer.from_pretrained(tok.name_or_path)
    tok.chat_template = template
    return tok


def _renders_as_transformers(tok) -> None:
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} é 😀"}
                for i in range(41)]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert finishes(render_template, tok, messages, RenderBudget()) == expected


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_is_stopped_naming_the_template_and_rendering_goes_on(tok, name):
    hostile = _with_template(tok, BOMBS[name])
    with pytest.raises(BadRequest, match="chat template of .* and was stopped") as info:
        finishes(render_template, hostile, HI, RenderBudget(max_s=0.5, max_compile_s=0.5))
    assert str(tok.name_or_path) in str(info.value) and "\n" not in str(info.value)
    _renders_as_transformers(tok)


@pytest.mark.parametrize("name", BROKEN)
def test_a_blocked_raising_or_broken_template_is_bad_input(tok, name):
    template, words = BROKEN[name]
    with pytest.raises(BadRequest, match="chat template of") as info:
        build(_with_template(tok, template), GenerateRequest(prompt="hi"), [], 2048)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_template_over_the_size_bound_is_refused_before_rendering(tok):
    long = _with_template(tok, "{# pad #}" + " " * MAX_TEMPLATE_CHARS)
    with pytest.raises(BadRequest, match="more than the .* a chat template may have"):
        finishes(render_template, long, HI, RenderBudget())


@pytest.mark.parametrize("bomb", [SILENT, POWER], ids=["loops", "power"])
def test_cancel_stops_a_rendering_bomb(tok, bomb):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    # an hour's budget: only the cancel can end it
    budget = RenderBudget(cancel, max_s=3600, max_compile_s=3600)
    with pytest.raises(RenderCancelled):
        finishes(render_template, _with_template(tok, bomb), HI, budget)
    _renders_as_transformers(tok)


def test_a_real_template_renders_as_transformers_does_under_the_budget(tok):
    _renders_as_transformers(tok)


def test_keys_that_are_none_render_as_transformers_renders_them(tok):
    """apply_chat_template drops None values (an OpenAI client's `tool_calls: null`); the child
    does it itself, as its transformers may predate the function that does it there."""
    messages = [{"role": "user", "content": "hi", "name": None},
                {"role": "assistant", "content": "hello", "tool_calls": None},
                {"role": "user", "content": "again"}]
    plain = [{k: v for k, v in m.items() if v is not None} for m in messages]
    expected = tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert finishes(render_template, tok, messages, RenderBudget()) == expected
    assert "None" not in expected


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("hearth:")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def test_hearth_run_stops_the_bomb_with_one_line_and_runs_again(bomb_model, capsys):
    argv = ["run", "--model", str(bomb_model), "--prompt", "hi", "--device", "cpu",
            "--max-new-tokens", "2"]
    assert finishes(cli.main, argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "chat template of" in line and str(bomb_model) in line and "was stopped" in line
    # the same process answers again: the bomb's renderer is gone, not running on
    assert finishes(cli.main, [*argv, "--raw"]) == 0


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_hearth_run_refuses_an_oversize_template_with_one_line(tiny_model, tmp_path, capsys,
                                                               where):
    folder = _model_with_template(tiny_model, tmp_path, "{{ messages }}")
    if where == "chat_template.jinja":  # sparse: its size is what is checked, nothing is read
        with (folder / where).open("wb") as f:
            f.truncate(MAX_TEMPLATE_CHARS + 1)
    else:  # a few hundred KiB of nested if-blocks
        depth = 50
        block = "{% if x %}" * depth + "y" + "{% endif %}" * depth
        config = json.loads((folder / where).read_text())
        config["chat_template"] = block * (MAX_TEMPLATE_CHARS // len(block) + 1)
        (folder / where).write_text(json.dumps(config))
    argv = ["run", "--model", str(folder), "--prompt", "hi", "--device", "cpu",
            "--max-new-tokens", "2"]
    assert finishes(cli.main, argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert where in line and "a chat template may have" in line


def test_the_worker_answers_cancel_and_exits_on_closed_stdin_while_rendering(bomb_model):
    worker = WorkerProcess()
    try:
        worker.send(command="load", model=str(bomb_model), device="cpu")
        assert finishes(worker.stream)[-1].name == "loaded"
        worker.send(command="generate", prompt="hi", max_new_tokens=2)
        time.sleep(0.5)  # rendering now, or about to
        worker.send(command="cancel")
        events = finishes(worker.stream)
        assert [e.name for e in events] == ["finished"] and events[0].reason == "cancelled"

        worker.send(command="generate", prompt="hi", max_new_tokens=2, raw=True)
        assert finishes(worker.stream)[-1].name == "finished"  # it answers again

        worker.send(command="generate", prompt="hi", max_new_tokens=2)
        time.sleep(0.5)
        worker.proc.stdin.close()
        assert worker.proc.wait(timeout=HANG_GUARD_S) == 0
    finally:
        worker.proc.kill()
        worker.proc.wait()


def test_hearth_serve_answers_while_a_bomb_renders_and_stops_on_sigterm(bomb_model):
    """/health and the other routes answer while the bomb renders; its request gets a 400 in
    OpenAI's shape; a plain request is served after it; SIGTERM ends the server meanwhile."""
    httpx = pytest.importorskip("httpx")
    openai = pytest.importorskip("openai")
    proc, url = hearth_serve("--model", str(bomb_model))
    try:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=HANG_GUARD_S)
        ask = lambda: client.chat.completions.create(model="bomb-model", messages=HI,
                                                     max_tokens=2)
        asking = ThreadPoolExecutor(2)
        bomb = asking.submit(ask)
        while not bomb.done():  # every check answers while it renders
            health = httpx.get(url.removesuffix("/v1") + "/health", timeout=HANG_GUARD_S)
            assert health.status_code == 200
            assert httpx.get(url + "/models", timeout=HANG_GUARD_S).status_code == 200
            time.sleep(0.2)
        with pytest.raises(openai.BadRequestError) as info:
            bomb.result()
        assert "chat template of" in info.value.message and "was stopped" in info.value.message
        plain = client.completions.create(model="bomb-model", prompt="hi", max_tokens=2)
        assert plain.choices[0].finish_reason in ("length", "stop")

        asking.submit(ask)  # another bomb, rendering when the signal comes
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_GUARD_S) == 0
        asking.shutdown(wait=False)
    finally:
        proc.kill()
        proc.wait()
