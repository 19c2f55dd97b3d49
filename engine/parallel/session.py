"""A Session over N ranks (`--tensor-parallel N`): the model is loaded whole into host memory,
cut by a TPLeader (rank 0 in this process, one follower process per other GPU), and generated
from only in continuous batches through the leader's batched decoder (parallel/batch_ops.py):
prompt lookup's verify rows among them, and a single generation as a batch of one.

Not the lockstep (parallel/leader.py) nor the math (parallel/sharded_step.py). Generation,
sampling, stop strings and prompt lookup are the batch's own (generate/batch_run.py),
unchanged: only rank 0 samples. A draft model is refused at load (LoadRequest.validate).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import torch

from engine.cache.kv_cache import BLOCK_SIZE
from engine.config import overrides
from engine.config.backends import Backends
from engine.events import BadRequest, Loaded, LoadProgress, LoadRequest
from engine.files.model_folder import check
from engine.generate.session import Session
from engine.generate.session_load import resolve_config
from engine.load import loader
from engine.parallel import request as tp_request
from engine.parallel.batch_ops import RankBatch
from engine.parallel.leader import TPLeader
from engine.plan.multi_gpu import NCCL_BUFFERS_BYTES


def device_for(req: LoadRequest) -> torch.device:
    """Rank 0's device: cuda:0 (rank r runs on cuda:r), or the CPU for gloo with --device cpu."""
    if req.device == "cpu":
        return torch.device("cpu")
    n, seen = req.tensor_parallel, torch.cuda.device_count()
    if seen < n:  # NVML may see cards that this torch cannot use (a CPU build, say)
        raise BadRequest(f"--tensor-parallel {n} needs {n} CUDA GPUs and torch sees {seen}; "
                         f"--device cpu runs the ranks as CPU processes (gloo), for testing")
    return torch.device("cuda", 0)


def host_request(req: LoadRequest, device: torch.device) -> LoadRequest:
    """The request that loads the whole model into host memory, in the 16-bit format the ranks
    will hold (a model larger than one card never sits whole on a GPU)."""
    quant = req.quant
    if quant == "auto" and device.type == "cuda":
        quant = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return replace(req, device="cpu", quant=quant, memory_limit_gib=None, tensor_parallel=1)


def random_host_model(folder, req: LoadRequest, device: torch.device) -> loader.LoadedModel:
    """Random weights for `hearth bench --random-weights --tensor-parallel N`, in host memory as
    host_request loads real ones. On GPUs they are made on the last one and copied down (random
    init on the host's CPU is slow for a large model); that GPU's cache is emptied."""
    host = host_request(req, device)
    if device.type != "cuda":
        return loader.random_model(folder, host)
    with torch.cuda.device(torch.cuda.device_count() - 1):
        lm = loader.random_model(folder, replace(host, device="cuda"))
        lm.model.to("cpu")
        torch.cuda.empty_cache()
    return replace(lm, device=torch.device("cpu"))


def rank_kv_dtype(lm: loader.LoadedModel, requested: str) -> tuple[str, str]:
    """(the ranks' KV dtype, why): as asked (validated 16-bit), else the weights' own."""
    if requested != "auto":
        return requested, "as asked"
    return lm.quant, (f"auto: the weights' own {lm.quant}; tensor parallelism keeps a 16-bit "
                      f"cache so far")


class TPSession(Session):
    """Session over a TPLeader: Session.__init__ itself, with the leader as its decoder (whose
    cache is rank 0's: its KV heads, and the tokens they hold), and `leader`, which close()
    ends. Every generation runs in a batch: `generate` is a batch of one."""

    def __init__(self, lm: loader.LoadedModel, req: LoadRequest, device: torch.device,
                 backends: Backends | None = None):
        self._weights_bytes = lm.weights_bytes  # before the host copy goes
        self._kv_choice = rank_kv_dtype(lm, req.kv_dtype)
        self._backends = Backends() if backends is None else backends  # every rank's
        # --kv-tokens: that many on every rank (each holds 1/N of the heads), not clamped to
        # one GPU's free memory: a rank whose arena does not fit fails the load
        blocks = -(-req.kv_tokens // BLOCK_SIZE) if req.kv_tokens is not None else None
        self.leader = TPLeader(lm.model, req.tensor_parallel, lm.context, self._kv_choice[0],
                               device, req.memory_limit_gib, self._backends, blocks)
        # rank 0's Decoder, for the batch's passes: kept after a failure ends the leader's rank,
        # so that a batch made then still answers, with the failure (the batch holds it anyway)
        self._rank_decoder = self.leader.rank.decoder
        self._batches: dict[int, RankBatch] = {}  # by max_rows: kept, with their graphs
        try:
            lm.model.to("meta")  # every rank holds its own copy now: free the host's
            super().__init__(replace(lm, device=self.leader.device), req.kv_dtype,
                             compile_layers=req.compile, reproducible=req.reproducible,
                             kv_tokens=req.kv_tokens)
            self.num_speculative_tokens = req.num_speculative_tokens
        except BaseException:
            self.leader.close()
            raise

    def _configure(self, lm, kv_dtype, fast_path, compile_layers, reproducible=None):
        """Session's resolution, for the share of the model one card holds (NCCL's buffers
        off the allocator's budget), with the KV dtype the leader's caches were made with."""
        kv, why = self._kv_choice
        config = resolve_config(lm, kv, fast_path, compile_layers, backends=self._backends,
                                world_size=self.leader.spec.world_size,
                                reproducible=reproducible,
                                reserved_bytes=NCCL_BUFFERS_BYTES)
        return replace(config, kv_reason=why)

    def batched_decoder(self, max_rows: int) -> RankBatch:
        batch = self._batches.get(max_rows)
        if batch is None:
            batch = self._batches[max_rows] = RankBatch(self.leader, self._rank_decoder,
                                                        max_rows)
        return batch

    def _open_decoder(self) -> tuple[TPLeader, None]:
        # the decode kernel is not checked on the ranks yet: their steps read the cache as
        # FamilyStep does (the Triton kernel on a GPU); tensor parallelism has not run on GPUs
        return self.leader, None

    @classmethod
    def load(cls, req: LoadRequest, progress: Callable[[LoadProgress], None] = lambda e: None,
             cancel: threading.Event | None = None) -> TPSession:
        req.validate()
        folder = check(req.model)
        tp_request.check(req, folder.path)
        device = device_for(req)
        backends = overrides.backends()  # the developer overrides: read once a load
        lm = loader.load(folder, host_request(req, device), progress, cancel, backends=backends)
        n = req.tensor_parallel
        progress(LoadProgress("tensor parallel", 0, 1, f"cutting the model {n} ways and starting "
                                                       f"{n - 1} more rank{'s' * (n > 2)}"))
        if cancel is not None and cancel.is_set():
            raise loader.LoadCancelled()
        session = cls(lm, req, device, backends)
        if cancel is not None and cancel.is_set():
            session.close()
            raise loader.LoadCancelled()
        return session

    def loaded_event(self) -> Loaded:
        """The whole model's weights; the KV cache of one GPU (each holds 1/N of its heads), as
        Stats report it beside that GPU's memory."""
        n = self.leader.spec.world_size
        event = super().loaded_event()
        share = (f"each of the {n} ranks holds 1/{n} of the attention heads, KV heads and MLP "
                 f"columns; the KV cache figure is one rank's")
        return replace(event, weights_bytes=self._weights_bytes, notes=(*event.notes, share))

    def close(self) -> None:
        """End the follower processes and leave the process group; safe to call twice."""
        self.leader.close()
