"""`hearth run --json --logprobs N`: each token event carries its logprob and the N likeliest
tokens' (the greedy token the likeliest of them); without --json it is bad input."""

from __future__ import annotations

from engine.cli import cli
from engine.events import event_from_json


def test_json_token_events_carry_the_logprobs_asked_for(tiny_model, capsys):
    rc = cli.main(["run", "--model", str(tiny_model), "--prompt", "hello there", "--raw",
                   "--temperature", "0", "--max-new-tokens", "4", "--device", "cpu", "--json",
                   "--logprobs", "3"])
    assert rc == 0
    events = [event_from_json(line) for line in capsys.readouterr().out.splitlines()]
    tokens = [e for e in events if e.name == "token" and e.token_ids]
    assert sum(len(e.token_ids) for e in tokens) == 4
    for e in tokens:
        assert len(e.logprobs) == len(e.token_ids)
        for token, (logprob, top) in zip(e.token_ids, e.logprobs, strict=True):
            assert len(top) == 3 and top[0] == (token, logprob) and logprob <= 0


def test_logprobs_without_json_is_bad_input(tiny_model, capsys):
    rc = cli.main(["run", "--model", str(tiny_model), "--prompt", "hi", "--logprobs", "2"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--logprobs" in err and "--json" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err
