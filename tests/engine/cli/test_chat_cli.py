"""`hearth chat` on the tiny Qwen2 fixture: driven through a pseudo-terminal (pexpect) for every
command, Ctrl+C and Ctrl+D; piped stdin in-process; the multi-line reader on its own."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys

import pytest

from engine.cli import cli
from engine.cli.chat_cli import read_message
from tests.engine.helpers import REPO

pexpect = pytest.importorskip("pexpect")
TIMEOUT_S = 90  # a busy 2-core machine: torch's import alone takes seconds


def spawn(model, max_new_tokens: int):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TERM": "dumb"}
    child = pexpect.spawn(sys.executable, ["-m", "engine.cli.cli", "chat", "--model", str(model),
                                           "--temperature", "0", "--max-new-tokens",
                                           str(max_new_tokens)],
                          cwd=REPO, env=env, encoding="utf-8", timeout=TIMEOUT_S)
    child.expect_exact("Type /help for help")
    child.expect_exact(">>> ")
    return child


def ask(child, line: str) -> str:
    """Send a line; what came back before the next prompt."""
    child.sendline(line)
    child.expect_exact(">>> ")
    return child.before


def saved(child, path) -> list[dict]:
    assert "saved" in ask(child, f"/save {path}")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def chat(tiny_models):
    child = spawn(tiny_models["qwen2"], 6)
    yield child
    if child.isalive():
        child.terminate(force=True)


def test_an_answer_streams_and_the_next_turn_reuses_the_cache(chat):
    first = ask(chat, "hello there")
    assert first.replace("hello there", "").strip()  # some answer text came back
    ask(chat, "and then?")
    stats = ask(chat, "/stats")
    match = re.search(r"6 tokens, .* prompt (\d+) tokens \((\d+) from the cache", stats)
    assert match, stats
    prompt, cached = map(int, match.groups())
    assert 0 < cached < prompt  # the first turn's K/V were kept; only the new turn computed


def test_save_writes_the_conversation_as_run_reads_it(chat, tmp_path):
    messages = saved(chat, tmp_path / "chat.json")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == "hello there"
    assert cli._read_messages(str(tmp_path / "chat.json")) == tuple(messages)  # --messages


def test_reset_starts_a_new_conversation(chat, tmp_path):
    assert "a new conversation" in ask(chat, "/reset")
    assert saved(chat, tmp_path / "empty.json") == []


def test_a_backslash_continues_the_message(chat, tmp_path):
    chat.sendline("first line \\")
    chat.expect_exact("... ")
    ask(chat, "second line")
    messages = saved(chat, tmp_path / "multi.json")
    assert messages[-2] == {"role": "user", "content": "first line \nsecond line"}


def test_triple_quotes_hold_a_block(chat, tmp_path):
    ask(chat, "/reset")
    chat.sendline('"""one')
    chat.expect_exact("... ")
    chat.sendline("")
    chat.expect_exact("... ")
    ask(chat, 'three"""')
    messages = saved(chat, tmp_path / "block.json")
    assert messages[0] == {"role": "user", "content": "one\n\nthree"}


def test_system_sets_the_system_prompt(chat, tmp_path):
    ask(chat, "/reset")
    assert "system prompt set" in ask(chat, "/system Answer briefly.")
    ask(chat, "hi")
    messages = saved(chat, tmp_path / "system.json")
    assert messages[0] == {"role": "system", "content": "Answer briefly."}
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert "removed" in ask(chat, "/system")


def test_help_and_unknown_commands_answer_without_generating(chat):
    assert "/save FILE" in ask(chat, "/help")
    assert "unknown command /nope" in ask(chat, "/nope")


def test_one_ctrl_c_at_the_prompt_warns_and_ctrl_d_leaves(chat):
    chat.sendintr()
    chat.expect_exact("Ctrl+C again")
    chat.expect_exact(">>> ")
    assert chat.isalive()
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def test_ctrl_c_stops_an_answer_and_a_second_leaves(tiny_models, tmp_path):
    child = spawn(tiny_models["qwen2"], 1900)  # an answer long enough to be stopped midway
    try:
        child.sendline("go on and on")
        child.expect_exact("go on and on")
        child.expect(r"\S")  # the answer has begun streaming
        child.sendintr()
        child.expect_exact("[stopped]")
        child.expect_exact(">>> ")
        stats = ask(child, "/stats")
        new_tokens = int(re.search(r"(\d+) tokens, ttft", stats).group(1))
        assert 0 < new_tokens < 1900
        kept = saved(child, tmp_path / "stopped.json")  # the turn stays, as in the window
        assert [m["role"] for m in kept] == ["user", "assistant"]
        assert kept[0]["content"] == "go on and on" and kept[1]["content"]
        child.sendintr()  # the second Ctrl+C: at the prompt, after the stopped answer
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_piped_stdin_answers_each_message_and_exits(tiny_models, tmp_path, monkeypatch,
                                                    capsys):
    path = tmp_path / "piped.json"
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"first question\nsecond \\\nquestion\n"
                                                  f"/save {path}\n"))
    assert cli.main(["chat", "--model", str(tiny_models["qwen2"]), "--temperature", "0",
                     "--max-new-tokens", "4"]) == 0
    messages = json.loads(path.read_text(encoding="utf-8"))
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        "first question", "second \nquestion"]
    out = capsys.readouterr().out
    assert out.count("\n") >= 2 and ">>>" not in out  # two answers, no prompts on a pipe


def test_piped_stdin_over_an_endpoint_keeps_the_conversation(tmp_path, monkeypatch, capsys):
    from tests.fake_endpoint import ANSWER, FakeEndpoint

    path = tmp_path / "remote.json"
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"hi\nand again\n/save {path}\n"))
    with FakeEndpoint() as endpoint:
        assert cli.main(["chat", "--endpoint", endpoint.base_url, "--model", "fake-7b"]) == 0
        sent = [body["messages"] for body in endpoint.chat_requests]
    assert capsys.readouterr().out == "".join(ANSWER) + "\n" + "".join(ANSWER) + "\n"
    assert sent[1] == [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "".join(ANSWER)},
                       {"role": "user", "content": "and again"}]  # the history travels
    assert len(json.loads(path.read_text(encoding="utf-8"))) == 4


def test_an_endpoint_with_local_settings_is_refused(capsys):
    assert cli.main(["chat", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m",
                     "--quant", "int8"]) == 2
    assert "--quant" in capsys.readouterr().err


def test_a_bad_model_is_one_sentence_and_exit_2(tmp_path, capsys):
    assert cli.main(["chat", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("lines, expected", [
    (["plain"], "plain"),
    (["a\\", "b\\", "c"], "a\nb\nc"),
    (['"""x', "y", 'z"""'], "x\ny\nz"),
    (['"""single"""'], "single"),
    (["a\\"], "a\n"),  # the input ended inside the message: what was typed is the message
])
def test_read_message_joins_lines(lines, expected):
    feed = iter(lines)

    def read_line(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    assert read_message(read_line) == expected


class _Recorded:
    """What the engine used: each answer's resolved sampler settings and each rendered
    prompt's messages (the chat template's input)."""

    def __init__(self, monkeypatch):
        from engine.generate import constrained, prompt

        self.samplers, self.rendered = [], []
        real_sampler, real_render = constrained.Sampler, prompt.render_template

        def sampler(s, *args):
            self.samplers.append(s)
            return real_sampler(s, *args)

        def render(tok, messages, budget, extra=None):
            self.rendered.append([dict(m) for m in messages])
            return real_render(tok, messages, budget, extra)

        monkeypatch.setattr(constrained, "Sampler", sampler)
        monkeypatch.setattr(prompt, "render_template", render)


def test_set_changes_the_sampler_the_next_answer_uses(tiny_models, monkeypatch, capsys):
    used = _Recorded(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(
        "/set temperature 0.2\n/set top-p 0.5\n/set top_k 7\n/set repetition_penalty 1.3\n"
        "/set seed 11\n/set max_tokens 3\n/set system Be brief.\n/set temperature -1\n"
        "/set top_k many\n/set warmth 3\n/set\nhello\n"))
    assert cli.main(["chat", "--model", str(tiny_models["qwen2"]), "--temperature", "0.9",
                     "--max-new-tokens", "50"]) == 0
    [s] = used.samplers
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.seed) == (
        0.2, 0.5, 7, 1.3, 11)
    assert used.rendered[-1][0] == {"role": "system", "content": "Be brief."}
    err = capsys.readouterr().err
    assert "temperature is 0.2" in err and "max_tokens is 3" in err
    bad = [line for line in err.splitlines() if line.startswith("hearth: ")]
    assert len(bad) == 3  # each bad value: one line, and the setting stays
    assert "temperature stays 0.2" in bad[0] and "top_k takes a whole number" in bad[1]
    assert "/set knows temperature" in bad[2]
    shown = err[err.index("  temperature"):]
    for line in ("temperature        0.2", "top_p              0.5", "top_k              7",
                 "repetition_penalty 1.3", "max_tokens         3", "seed               11",
                 "system             'Be brief.'"):
        assert line in shown


def test_set_default_gives_a_setting_back_to_the_model(tiny_models, monkeypatch):
    used = _Recorded(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("/set temperature default\nhi\n"))
    assert cli.main(["chat", "--model", str(tiny_models["qwen2"]), "--temperature", "0",
                     "--max-new-tokens", "2"]) == 0
    [s] = used.samplers
    assert s.temperature > 0  # the model's (or the engine's) default, not the flag's greedy 0


class _CtrlCAtFirstToken(io.StringIO):
    """stdout that presses Ctrl+C (a real SIGINT) once the answer's first text arrives."""

    pressed = False

    def write(self, text: str) -> int:
        if text.strip() and not self.pressed:
            self.pressed = True
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(text)


def test_ctrl_c_keeps_the_question_and_the_partial_answer(tiny_models, monkeypatch, capsys):
    used = _Recorded(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("My name is Ada, tell me a long story\n"
                                                  "What is my name?\n"))
    out = _CtrlCAtFirstToken()
    monkeypatch.setattr(sys, "stdout", out)
    assert cli.main(["chat", "--model", str(tiny_models["qwen2"]), "--temperature", "0",
                     "--max-new-tokens", "1500"]) == 0
    assert "[stopped]" in capsys.readouterr().err
    question = {"role": "user", "content": "My name is Ada, tell me a long story"}
    assert used.rendered[0] == [question]
    kept, partial, asked = used.rendered[-1]  # the next question's prompt
    assert (kept, asked) == (question, {"role": "user", "content": "What is my name?"})
    assert partial["role"] == "assistant" and partial["content"].strip()
    assert out.getvalue().startswith(partial["content"] + "\n")  # all that was shown, no more
