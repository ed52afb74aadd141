"""A model the project trained, served on one cloud: an OpenAI-compatible ``/v1/completions`` endpoint.

The weights are a safetensors artifact in the cloud's own store. The server
loads them only once the warm check of issue 6 says every chunk is there, so a
replica never starts by pulling a model across the WAN: a cold cloud is refused
at start, with the fix (preheat). The model is built by the training program's
own ``build_model(args)`` and fed by the program's tokenizer: bytes for
``byte-lm``, the BPE ``tokenizer.json`` of ``prepare.py`` for ``hf-causal-lm``.
``GET /health`` answers 200 only after the model is loaded and one warm-up
generation answered, which is what the router's health checks wait for.

Generation runs on CPU (or the device torch finds), one request at a time in
one worker thread, behind a bounded queue: a full queue answers 503, which the
router retries on another cloud. ``stream: true`` answers server-sent events,
a chunk per piece of text as it is generated.

    python -m crosscloud.serving.server --cloud beijing --tenant team-a --model <sha256[:size] | file.safetensors> \\
        --program examples/byte_lm/train.py --args '{"seed": 0, "model_size": "tiny"}' --port 8101
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from crosscloud.core.federation import load_federation
from crosscloud.core.keys import manifest_key
from crosscloud.serving.meter import Meter
from crosscloud.store.base import ObjectNotFound, ObjectStore
from crosscloud.store.chunks import BLOB_TEXT, BlobRef, read_blob, warmth
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes
from crosscloud.training.program import ProgramError, load_program, local_file, program_family, program_source
from crosscloud.training.session import load_params, parameters

MAX_TOKENS = 256  # the most tokens one request may ask for: a request's time stays bounded
QUEUE = 64  # requests waiting for the worker beyond which a replica answers 503 (the router retries elsewhere)
CLOUD_HEADER = "X-Crosscloud-Cloud"  # which cloud answered: how clients and tests see the traffic split


class NotWarm(RuntimeError):
    """The model is not complete in this cloud's store: serving it would pull it over the WAN on the first request."""


def artifact_ref(store: ObjectStore, tenant: str, named: str, what: str = "model") -> BlobRef:
    """The artifact ``named`` names: a local file (its content), ``sha256:size`` or a bare sha256."""
    path = Path(named)
    if path.is_file():
        return BlobRef.of(path.read_bytes())
    sha, _, size = named.partition(":")
    if size:
        return BlobRef(sha256=sha, size=int(size))
    try:
        return BlobRef(sha256=sha, size=json.loads(store.get(manifest_key(tenant, sha)))["size"])
    except ObjectNotFound:
        raise NotWarm(f"cloud {store.cloud}: no artifact {sha[:12]} here (no manifest): preheat the {what} to "
                      f"{store.cloud} before starting a replica there") from None


def warm_bytes(store: ObjectStore, tenant: str, ref: BlobRef, what: str = "model") -> bytes:
    """The artifact's bytes, read only after the warm check says the cloud holds every chunk."""
    state = warmth(store, tenant, ref)
    if not state.warm:
        missing = "no manifest" if not state.manifest else f"{state.missing_bytes} of {ref.size} bytes missing"
        raise NotWarm(f"cloud {store.cloud}: {what} {ref.sha256[:12]} is not warm here ({missing}); preheat it "
                      f"(crosscloud.artifacts.preheat.fetch) before starting a replica on {store.cloud}")
    return read_blob(store, tenant, ref)


def warm_file(store: ObjectStore, tenant: str, text: str, what: str, name: str) -> str:
    """The artifact ``text`` names (sha256[:size]) as a local file named ``name``, once this cloud's warm check of
    it passed: a replica reads only what preheating put on its own cloud."""
    ref = artifact_ref(store, tenant, text, what)
    warm_bytes(store, tenant, ref, what)
    return str(local_file(store, tenant, ref, name))


def tokenizer_file(store: ObjectStore, tenant: str, tokenizer: str | None) -> str | None:
    """The tokenizer's file: the artifact ``tokenizer`` names (sha256:size), warm on this cloud like the weights, so
    the replica decodes with the very file that was published; a path is used as given (specs from before)."""
    if not tokenizer or not BLOB_TEXT.fullmatch(tokenizer):
        return tokenizer
    return warm_file(store, tenant, tokenizer, "tokenizer", "tokenizer.json")


def program_file(store: ObjectStore, tenant: str, program: str, code: str | None) -> str:
    """The program to build the model with: its code blob as the run stored it (``code``: sha256[:size]), warm on
    this cloud like the weights, so a replica builds exactly the model that was trained; else ``program`` itself."""
    return warm_file(store, tenant, code, "program", Path(program).name) if code else program


class ByteTokenizer:
    """byte_lm's tokens: the UTF-8 bytes themselves."""

    start = 10  # a newline stands for an empty prompt
    eos = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


class BPETokenizer:
    """hf_causal_lm's tokens: the byte-level BPE ``prepare.py`` trained and saved as ``tokenizer.json``."""

    def __init__(self, path: Path, eos: int):
        from tokenizers import Tokenizer

        self.tokenizer, self.start, self.eos = Tokenizer.from_file(str(path)), eos, eos

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def tokenizer_for(family: str, module, path: str | None):
    """The program's own tokenizer: bytes for byte-lm, the BPE file for hf-causal-lm (``--tokenizer``)."""
    if family == "byte-lm":
        return ByteTokenizer()
    if not path:
        raise SystemExit(f"program family {family}: give its tokenizer file with --tokenizer (prepare.py's tokenizer.json)")
    return BPETokenizer(Path(path), int(getattr(module, "EOS_ID", 0)))


def context_length(model: torch.nn.Module) -> int:
    """The positions the model can read: byte_lm's preset, or a transformers config's limit."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        return int(cfg.seq_len)
    config = model.config
    return int(getattr(config, "n_positions", None) or config.max_position_embeddings)


class Engine:
    """A built, loaded model and its tokenizer; ``complete`` is called from one thread at a time."""

    def __init__(self, model: torch.nn.Module, tokenizer):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.context = context_length(model)
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def complete(self, prompt: str, max_tokens: int, temperature: float, seed: int | None = None,
                 on_token=None) -> tuple[str, int, int, str]:
        """(text, prompt tokens, completion tokens, finish reason): greedy at temperature 0, else sampled.

        ``on_token(ids)`` is called with the completion's ids so far after each token (streaming)."""
        prompt_ids = self.tokenizer.encode(prompt)
        ids = torch.tensor([prompt_ids or [self.tokenizer.start]], device=self.device)
        gen = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        out: list[int] = []
        reason = "length"
        for _ in range(max_tokens):
            result = self.model(ids[:, -self.context:])
            logits = getattr(result, "logits", result)[0, -1].float()
            if temperature <= 0:
                token = int(logits.argmax())
            else:
                token = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            if token == self.tokenizer.eos:
                reason = "stop"
                break
            out.append(token)
            if on_token is not None:
                on_token(list(out))
            ids = torch.cat([ids, torch.tensor([[token]], device=self.device)], dim=1)
        return self.tokenizer.decode(out), len(prompt_ids), len(out), reason


def build_engine(program: str, args: dict, weights: bytes, tokenizer: str | None) -> Engine:
    """The program's model with the served weights in it, and the program's tokenizer."""
    path = program_source(program)
    module = load_program(path, program)
    model = module.build_model(args)
    values = from_bytes(weights)
    for name, param in parameters(model).items():
        if name in values and values[name].shape != param.shape:
            raise ProgramError(f"the served weights do not fit the model build_model({args}) builds: {name} is "
                               f"{tuple(values[name].shape)} in them, {tuple(param.shape)} here; give the program the "
                               "args the model was trained with (the run's program_args, model_size)")
    load_params(model, values)  # names must be the program's own
    return Engine(model, tokenizer_for(program_family(module, program), module, tokenizer))


def export_hf(engine: Engine, tokenizer: str | None, out: Path) -> Path:
    """The served model as a Hugging Face folder (config, safetensors, tokenizer): what vLLM loads on a GPU cloud."""
    if not hasattr(engine.model, "save_pretrained"):
        raise SystemExit("--export: the program's model is not a transformers model; vLLM serves those only "
                         "(serve a byte_lm model with this server instead)")
    engine.model.save_pretrained(out, safe_serialization=True)
    if tokenizer:
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        eos = engine.tokenizer.tokenizer.id_to_token(engine.tokenizer.eos)
        (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                               "eos_token": eos, "bos_token": eos, "pad_token": eos}))
    return out


class CompletionRequest(BaseModel):
    """The OpenAI completions fields a replica honours; the rest (e.g. ``model``) are accepted and ignored."""

    model: str | None = None
    prompt: str | list[str] = ""
    max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    seed: int | None = None
    stream: bool = False


class Service:
    """One serving process's state: what it serves, whether it is ready, and its one generation worker."""

    def __init__(self, cloud: str, name: str, load, queue: int = QUEUE):
        self.cloud, self.name, self.load, self.queue = cloud, name, load, queue
        self.engine: Engine | None = None
        self.error: str | None = None
        self.pending = 0
        self.meter = Meter()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")

    def start(self) -> None:
        """Load the model and answer one warm-up generation, in the background: /health says when it is done."""
        def run() -> None:
            try:
                engine = self.load()
                engine.complete("\n", 2, 0.0)
                self.engine = engine
            except Exception as exc:  # noqa: BLE001 - reported by /health and the log, the process keeps answering
                self.error = f"{type(exc).__name__}: {exc}"
                print(f"crosscloud serve: cloud {self.cloud}: model failed to load: {self.error}", file=sys.stderr)

        threading.Thread(target=run, name="load-model", daemon=True).start()

    async def complete(self, req: CompletionRequest) -> JSONResponse:
        if self.engine is None:
            return self._refuse(503, self.error or "the model is still loading")
        if self.pending >= self.queue:
            return self._refuse(503, f"{self.pending} requests queued on cloud {self.cloud}")
        if req.stream:
            if isinstance(req.prompt, list):
                return self._refuse(400, "stream takes one prompt; send a list without stream")
            return StreamingResponse(self._stream(req), media_type="text/event-stream",
                                     headers={CLOUD_HEADER: self.cloud, "Cache-Control": "no-cache"})
        prompts = req.prompt if isinstance(req.prompt, list) else [req.prompt]
        self.pending += 1
        started = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
            results = [await loop.run_in_executor(self.worker, self.engine.complete, p, req.max_tokens,
                                                  req.temperature, req.seed) for p in prompts]
        finally:
            self.pending -= 1
        self.meter.record(sum(r[1] + r[2] for r in results), time.monotonic() - started)
        body = {
            **self._head(req),
            "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                        for i, (text, _, _, reason) in enumerate(results)],
            "usage": {"prompt_tokens": sum(r[1] for r in results), "completion_tokens": sum(r[2] for r in results),
                      "total_tokens": sum(r[1] + r[2] for r in results)},
        }
        return JSONResponse(body, headers={CLOUD_HEADER: self.cloud})

    def _head(self, req: CompletionRequest) -> dict:
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": req.model or self.name}

    async def _stream(self, req: CompletionRequest):
        """Server-sent events as OpenAI streams them: a chunk per piece of text, the finish reason, ``[DONE]``."""
        loop, queue, head = asyncio.get_running_loop(), asyncio.Queue(), self._head(req)
        emitted = ""

        def progress(ids: list[int]) -> None:  # from the worker thread: the completion so far, as text
            loop.call_soon_threadsafe(queue.put_nowait, ("text", self.engine.tokenizer.decode(ids)))

        def run() -> tuple:
            try:
                return self.engine.complete(req.prompt, req.max_tokens, req.temperature, req.seed, progress)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, ("end", None))

        self.pending += 1
        started = time.monotonic()
        try:
            done = loop.run_in_executor(self.worker, run)
            while (item := await queue.get())[0] == "text":
                if not item[1].endswith("\ufffd") and len(item[1]) > len(emitted):  # whole characters only
                    chunk, emitted = item[1][len(emitted):], item[1]
                    yield _event({**head, "choices": [{"index": 0, "text": chunk, "logprobs": None, "finish_reason": None}]})
            text, prompt_tokens, completion_tokens, reason = await done
            self.meter.record(prompt_tokens + completion_tokens, time.monotonic() - started)
            tail = {"index": 0, "text": text[len(emitted):], "logprobs": None, "finish_reason": reason}
            yield _event({**head, "choices": [tail]})
            yield "data: [DONE]\n\n"
        finally:
            self.pending -= 1

    def _refuse(self, status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "unavailable" if status == 503 else "invalid_request"}},
                            status_code=status, headers={CLOUD_HEADER: self.cloud})

    def health(self) -> JSONResponse:
        state = "ready" if self.engine else ("failed" if self.error else "loading")
        body = {"status": state, "cloud": self.cloud, "model": self.name, "queued": self.pending, "error": self.error,
                "served": self.meter.snapshot()}
        return JSONResponse(body, status_code=200 if self.engine else 503, headers={CLOUD_HEADER: self.cloud})


def _event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def create_app(replica: Service) -> FastAPI:
    """The HTTP surface: completions, health, and the one model this replica serves."""
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        replica.start()
        yield
        replica.worker.shutdown(wait=True)

    app = FastAPI(title=f"crosscloud serving {replica.cloud}", lifespan=lifespan)
    app.post("/v1/completions")(replica.complete)
    app.get("/health")(replica.health)
    app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": replica.name, "object": "model",
                                                                "owned_by": replica.cloud}]})
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m crosscloud.serving.server", description=__doc__.split("\n\n")[0])
    p.add_argument("--cloud", required=True, help="the cloud this replica runs on: its store must hold the model warm")
    p.add_argument("--tenant", required=True)
    p.add_argument("--model", required=True, help="the weights: sha256[:size] of the artifact, or a safetensors file")
    p.add_argument("--program", required=True, help="the training program that built the model (path or module)")
    p.add_argument("--program-code", help="the program's code blob as the run stored it (sha256[:size]); must be warm "
                   "here too. --program then only names its file")
    p.add_argument("--args", default="{}", help="the program's run.args as JSON (seed, model_size, size...)")
    p.add_argument("--tokenizer", help="hf-causal-lm: prepare.py's tokenizer.json, as an artifact (sha256[:size], warm "
                   "here like the weights) or a file")
    p.add_argument("--name", help="the model's name in responses (default: the artifact's sha256 prefix)")
    p.add_argument("--federation", help="federation file (default: $CROSSCLOUD_FEDERATION, else the embedded one)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--queue", type=int, default=QUEUE)
    p.add_argument("--export", type=Path, help="write the model as a Hugging Face folder here (for vLLM) and exit")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads: one is fastest for a small model and "
                   "leaves the other cores to other replicas (measured: 64 tokens in 0.06 s with 1, 1.3 s with 2 busy)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    store = open_store(load_federation(opts.federation).cloud(opts.cloud), opts.tenant)
    try:
        ref = artifact_ref(store, opts.tenant, opts.model)
        weights = warm_bytes(store, opts.tenant, ref)
        program = program_file(store, opts.tenant, opts.program, opts.program_code)
        opts.tokenizer = tokenizer_file(store, opts.tenant, opts.tokenizer)
    except NotWarm as exc:
        print(f"crosscloud serve: refused to start: {exc}", file=sys.stderr)
        return 3
    program_args = json.loads(opts.args)
    if opts.export:
        export_hf(build_engine(program, program_args, weights, opts.tokenizer), opts.tokenizer, opts.export)
        print(f"crosscloud serve: model {ref.sha256[:12]} written to {opts.export}")
        return 0
    replica = Service(opts.cloud, opts.name or f"crosscloud-{ref.sha256[:12]}",
                      lambda: build_engine(program, program_args, weights, opts.tokenizer), opts.queue)
    uvicorn.run(create_app(replica), host=opts.host, port=opts.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
