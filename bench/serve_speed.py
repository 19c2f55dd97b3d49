"""The speed targets, one process, one session: streaming clients of `hearth serve`'s app
(the official async `openai` SDK over HTTP on 127.0.0.1, from a process of their own) against
the engine's own rounds
(`hearth bench --concurrency`'s run_round) on the same session, in turn.

    python3 bench/serve_speed.py [--model DIR] [--random-weights --tokenizer DIR]
        [--quant bf16] [--clients 1,16] [--prompt-len 512] [--new-tokens 256] [--repeats 3]

With --random-weights the model's config is copied with the vocabulary of --tokenizer's folder
(the demo model's by default) so that generated ids decode to text the stream carries. Prints
one JSON line per (clients, path): aggregate decode tokens/s (each request's tokens after its
first, over the first first token to the last), TTFT p50; the server's counts its tokens from the
usage chunk and times its text chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "hearth_resources" / "demo_model"


def session_for(args):
    from engine.events import LoadRequest
    from engine.generate.session import Session
    from engine.load import loader

    context = args.prompt_len + args.new_tokens
    req = LoadRequest(model=args.model, quant=args.quant, device=args.device, context=context,
                      kv_tokens=max(args.clients) * (-(-context // 16) * 16))
    if not args.random_weights:
        from engine.files.model_folder import check

        lm = loader.load(check(args.model), req, lambda e: None)
    else:
        from engine.tools.bench.random_chat_model import random_chat_model

        lm = random_chat_model(args.model, args.tokenizer, req)
    return Session(lm, fast_path=True, kv_tokens=req.kv_tokens)


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab - 1, (length,), generator=g).tolist() for _ in range(n)]


async def client_round(url: str, model: str, batch: list[list[int]], new_tokens: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)

    async def one(ids):
        times, tokens = [], 0
        stream = await client.completions.create(
            model=model, prompt=ids, max_tokens=new_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                times.append(time.perf_counter())
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return times, tokens

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(ids) for ids in batch))
    await client.close()
    firsts = [t[0] for t, _ in results]
    last = max(t[-1] for t, _ in results)
    return dict(aggregate_decode_tokens_per_s=sum(n - 1 for _, n in results) / (last - min(firsts)),
                ttft_ms_p50=statistics.median(f - t0 for f in firsts) * 1000,
                tokens=sum(n for _, n in results))


def run_clients(url: str, model: str, batch: list[list[int]], new_tokens: int) -> dict:
    """In a process of its own (the engine's thread and the server's loop keep this one's GIL)."""
    return asyncio.run(client_round(url, model, batch, new_tokens))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(DEMO))
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--tokenizer", default=str(DEMO))
    p.add_argument("--quant", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--clients", default="1,16")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    args.clients = [int(n) for n in args.clients.split(",")]

    from engine.server.app import Settings, create_app
    from engine.server.model_view import ModelView
    from engine.server.runner import BackgroundServer, bind
    from engine.service.engine import Engine
    from engine.tools.bench.concurrent import run_round

    session = session_for(args)
    vocab = session.lm.model.config.vocab_size
    engine = Engine(max_seqs=max(args.clients))
    engine.session = session
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    view = ModelView.of(session, None)
    sock = bind("127.0.0.1", 0)
    settings = Settings("127.0.0.1", sock.getsockname()[1], None, max(args.clients))
    server = BackgroundServer(create_app(engine, view, settings), engine, sock).start()
    seeds = iter(range(1, 10_000))
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        run_round(engine, prompts(1, args.prompt_len, vocab, 0), 4)  # warm-up
        clients.submit(run_clients, server.url, view.id,
                       prompts(1, args.prompt_len, vocab, 0), 4).result()
        for n in args.clients:
            for path in ("engine", "server"):
                rows = []
                for _ in range(args.repeats):
                    batch = prompts(n, args.prompt_len, vocab, next(seeds))
                    if path == "engine":
                        r = run_round(engine, batch, args.new_tokens)
                        rows.append(dict(aggregate_decode_tokens_per_s=(
                            r.aggregate_decode_tokens_per_s), ttft_ms_p50=r.ttft_ms_p50,
                            tokens=r.total_tokens))
                    else:
                        rows.append(clients.submit(run_clients, server.url, view.id, batch,
                                                   args.new_tokens).result())
                agg = statistics.median(r["aggregate_decode_tokens_per_s"] for r in rows)
                print(json.dumps(dict(clients=n, path=path, quant=session.lm.quant,
                                      device=str(session.lm.device),
                                      aggregate_decode_tokens_per_s=round(agg, 1),
                                      ttft_ms_p50=round(statistics.median(
                                          r["ttft_ms_p50"] for r in rows), 1),
                                      tokens=rows[0]["tokens"])), flush=True)
    finally:
        clients.shutdown()
        server.stop()
        engine.stop()
        thread.join(30)


if __name__ == "__main__":
    main()
