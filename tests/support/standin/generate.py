"""Generation requests: SGLang's native ``/generate`` and the OpenAI ``/v1/completions`` and
``/v1/chat/completions``, stream and non-stream, single and batch, with the PD bootstrap fields
the router injects."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import fake_latency

from .http_base import BaseHandler

_BOOT_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
KINDS = {"/generate": "generate", "/v1/completions": "completions",
         "/v1/chat/completions": "chat"}  # fmt: skip


def err(message: str, code: int, etype: str = "BadRequestError", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def is_batch(kind: str, body: dict) -> bool:
    if kind == "generate":
        ids = body.get("input_ids")
        return isinstance(body.get("text"), list) or (
            isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        )
    if kind == "completions":
        p = body.get("prompt")
        return isinstance(p, list) and bool(p) and not isinstance(p[0], int)
    return False


def prompts_of(kind: str, body: dict) -> list:
    if kind == "generate":
        src = body.get("text") if body.get("text") is not None else body.get("input_ids")
    elif kind == "completions":
        src = body.get("prompt")
    else:
        msgs = body.get("messages")
        src = (
            " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            if isinstance(msgs, list)
            else ""
        )
        return [src]
    if is_batch(kind, body):
        return list(src) or [""]
    return [src if src is not None else ""]


def bootstrap_fields(body: dict, n: int) -> tuple[dict[str, list], tuple[str, str] | None]:
    """The router's injected fields, broadcast to lists; or (field, problem)."""
    out: dict[str, list] = {}
    for field in _BOOT_FIELDS:
        if field not in body or (body[field] is None and field != "bootstrap_port"):
            return out, (
                field,
                f"requires '{field}' in the request body (the router injects "
                "bootstrap_host, bootstrap_port and bootstrap_room)",
            )
    lengths = {len(body[f]) for f in _BOOT_FIELDS if isinstance(body[f], list)}
    if len(lengths) > 1:
        return out, ("bootstrap_room", "got bootstrap_* lists of different lengths")
    size = lengths.pop() if lengths else n
    for field in _BOOT_FIELDS:
        value = body[field]
        values = list(value) if isinstance(value, list) else [value] * size
        for v in values:
            ok = (
                isinstance(v, str) and v != ""
                if field == "bootstrap_host"
                else (v is None or (isinstance(v, int) and not isinstance(v, bool)))
                if field == "bootstrap_port"
                else isinstance(v, int) and not isinstance(v, bool)
            )
            if not ok:
                return out, (field, f"got an invalid '{field}': {v!r}")
        out[field] = values
    return out, None


class Pace:
    """A request that takes time: its first token after TTFT, then one token every ITL, each
    stretched by the latency model's knee (fake_latency.MODEL: ``FAKE_SGLANG_TTFT_MS``,
    ``FAKE_SGLANG_ITL_MS``, ``slowdown()``; reused, not copied). On when the engine is paced
    (``FAKE_SGLANG_PACED=1`` or control ``paced``) or the request names a rate itself
    (``fake_ttft_ms`` / ``fake_itl_ms`` in its body: stand-in fields, for direct clients).
    Tokens per item: the request's own limit, as SGLang honours it (``sampling_params.
    max_new_tokens``; OpenAI ``max_tokens`` / ``max_completion_tokens``), else
    ``FAKE_SGLANG_PACED_TOKENS``. A prefill pays the TTFT only (it computes no output)."""

    def __init__(self, ttft: float, itl: float, tokens: int) -> None:
        self.ttft, self.itl, self.tokens = ttft, itl, tokens
        self.sent = 0

    @classmethod
    def of(cls, paced: bool, default_tokens: int, kind: str, body: dict) -> Pace | None:
        own = {k: body.get(k) for k in ("fake_ttft_ms", "fake_itl_ms")
               if isinstance(body.get(k), int | float)}  # fmt: skip
        if not (paced or own):
            return None
        model = fake_latency.MODEL
        ttft = own["fake_ttft_ms"] / 1000 if "fake_ttft_ms" in own else model.ttft
        itl = own["fake_itl_ms"] / 1000 if "fake_itl_ms" in own else model.itl
        if kind == "generate":
            sp = body.get("sampling_params")
            limit = sp.get("max_new_tokens") if isinstance(sp, dict) else None
        else:
            limit = body.get("max_completion_tokens") or body.get("max_tokens")
        ok = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
        return cls(max(0.0, ttft), max(0.0, itl), limit if ok else default_tokens)

    def words(self, text: str) -> str:
        """``tokens`` words cycling through ``text``'s (its first word names the engine)."""
        base = text.split()
        return " ".join(base[k % len(base)] for k in range(self.tokens)) if base else ""

    def next_token(self) -> None:
        """Wait until the next token of the reply is due."""
        self.sent += 1
        secs = self.ttft if self.sent == 1 else self.itl
        if secs > 0:
            time.sleep(secs * fake_latency.MODEL.slowdown())
        fake_latency.MODEL.gate()  # no token while the scheduler is frozen

    def whole(self, n: int) -> None:
        """Wait until a non-stream reply of ``n`` tokens is done (at least the TTFT)."""
        for _ in range(max(1, n)):
            self.next_token()


def answer(
    h: BaseHandler,
    kind: str,
    body: dict,
    prompts: list,
    boot: dict[str, list],
    failures: dict[int, str],
    t0: float,
) -> None:
    """Write the reply of one generation request (all items answered)."""
    eng = h.server.engine
    port = h.server.server_port
    ok_text = "" if eng.role == "prefill" else f"[{eng.role}@{port}] hello from fake engine"
    pace = Pace.of(eng.paced, eng.knobs.paced_tokens, kind, body)
    if pace is not None:
        ok_text = pace.words(ok_text)
    # an item whose KV transfer failed comes back like SGLang's aborted request: HTTP 200,
    # empty text, finish_reason {"type": "abort", ...} (smg #2382, vllm #49238)
    texts = ["" if i in failures else ok_text for i in range(len(prompts))]
    batch = len(prompts) > 1 or is_batch(kind, body)
    stream = bool(body.get("stream"))
    model = body.get("model") if isinstance(body.get("model"), str) else None
    model = model if model and model != "unknown" else eng.served_name
    items = []
    for i, prompt in enumerate(prompts):
        n_words = len(texts[i].split())
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": ({"type": "abort", "message": failures[i]} if i in failures
                              else {"type": "length", "length": n_words}),
            "prompt_tokens": len(prompt) if isinstance(prompt, list) else len(str(prompt).split()),
            "completion_tokens": n_words,
            "cached_tokens": 0,
            "e2e_latency": 0.001,
            "role": eng.role,
            "port": port,
            "pid": os.getpid(),
        }  # fmt: skip
        if boot:
            meta["bootstrap_room_seen"] = boot["bootstrap_room"][i]
            meta["bootstrap_host_seen"] = boot["bootstrap_host"][i]
            meta["bootstrap_port_seen"] = boot["bootstrap_port"][i]
        items.append(meta)
    eng.count(items)
    if pace is not None and not stream:
        pace.whole(max(len(t.split()) for t in texts))
    eng.metrics.served(items, len(failures), time.monotonic() - t0)
    out = _Writer(h, kind, model, items, texts, batch, pace if stream else None)
    if stream:
        out.stream()
    else:
        out.whole()


class _Writer:
    """One reply in the shape of its endpoint."""

    def __init__(self, h: BaseHandler, kind: str, model: str, items: list[dict],
                 texts: list[str], batch: bool, pace: Pace | None) -> None:  # fmt: skip
        self.h, self.kind, self.model, self.items, self.texts = h, kind, model, items, texts
        self.batch, self.pace = batch, pace
        self.created = int(time.time())
        self.meta_out: Any = items if batch else items[0]
        # OpenAI choices carry the finish_reason's type ("length", or "abort" for a failure)
        self.reasons = [m["finish_reason"]["type"] for m in items]
        self.usage = {
            "prompt_tokens": sum(m["prompt_tokens"] for m in items),
            "completion_tokens": sum(m["completion_tokens"] for m in items),
            "total_tokens": sum(m["prompt_tokens"] + m["completion_tokens"] for m in items),
            "prompt_tokens_details": None,
        }
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-"}.get(kind, "")
        self.rid = prefix + uuid.uuid4().hex

    # ---- non-stream -------------------------------------------------------------------------

    def whole(self) -> None:
        h, items, texts = self.h, self.items, self.texts
        if self.kind == "generate":
            outs = [{"text": texts[i], "output_ids": list(range(len(texts[i].split()))),
                     "meta_info": m} for i, m in enumerate(items)]  # fmt: skip
            h._json(200, outs if self.batch else outs[0])
            return
        if self.kind == "chat":
            choices = [{"index": 0,
                        "message": {"role": "assistant", "content": texts[0],
                                    "reasoning_content": None, "tool_calls": None},
                        "logprobs": None, "finish_reason": self.reasons[0],
                        "matched_stop": None}]  # fmt: skip
            obj = "chat.completion"
        else:
            choices = [{"index": i, "text": texts[i], "logprobs": None,
                        "finish_reason": self.reasons[i], "matched_stop": None}
                       for i in range(len(items))]  # fmt: skip
            obj = "text_completion"
        h._json(200, {"id": self.rid, "object": obj, "created": self.created,
                      "model": self.model, "choices": choices, "usage": self.usage,
                      "meta_info": self.meta_out})  # fmt: skip

    # ---- stream -----------------------------------------------------------------------------

    def token(self) -> None:
        """Before each streamed token: wait for it when the request is paced."""
        if self.pace is not None:
            self.pace.next_token()

    def stream(self) -> None:
        h = self.h
        if self.pace is not None and not any(self.texts):
            self.pace.next_token()  # a prefill (or all items failed): the TTFT only
        h._sse_start()
        {"generate": self._stream_generate, "chat": self._stream_chat,
         "completions": self._stream_completions}[self.kind]()  # fmt: skip
        h._sse_end()

    def _stream_generate(self) -> None:
        for i, m in enumerate(self.items):
            text = self.texts[i]
            words = text.split()
            for k in range(1, len(words) + 1):
                self.token()
                chunk = {"text": " ".join(words[:k]), "output_ids": list(range(k)),
                         "meta_info": {**m, "completion_tokens": k, "finish_reason": None}}
                if self.batch:
                    chunk["index"] = i
                self.h._sse(chunk)
            final = {"text": text, "output_ids": list(range(len(words))), "meta_info": m}
            if self.batch:
                final["index"] = i
            self.h._sse(final)

    def _stream_chat(self) -> None:
        base = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model}  # fmt: skip

        def choice(delta: dict, finish: str | None = None, **extra: Any) -> dict:
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish, **extra}]}  # fmt: skip

        self.h._sse(choice({"role": "assistant", "content": ""}))
        for k, w in enumerate(self.texts[0].split()):
            self.token()
            self.h._sse(choice({"content": w if k == 0 else " " + w}))
        self.h._sse({**choice({}, self.reasons[0], matched_stop=None), "usage": self.usage,
                     "meta_info": self.meta_out})  # fmt: skip

    def _stream_completions(self) -> None:
        base = {"id": self.rid, "object": "text_completion", "created": self.created,
                "model": self.model}  # fmt: skip
        for i in range(len(self.items)):
            for k, w in enumerate(self.texts[i].split()):
                self.token()
                self.h._sse({**base, "choices": [{"index": i, "text": w if k == 0 else " " + w,
                                                  "logprobs": None, "finish_reason": None}]})
            self.h._sse({**base, "choices": [{"index": i, "text": "", "logprobs": None,
                                              "finish_reason": self.reasons[i],
                                              "matched_stop": None}]})  # fmt: skip
        self.h._sse({**base, "choices": [], "usage": self.usage, "meta_info": self.meta_out})
