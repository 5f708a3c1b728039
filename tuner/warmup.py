"""The warm-up a deployment runs before it takes traffic: the measured workload's own requests.

    warmup_plan(spec, served_model)  WarmupPlan: prompt and output lengths at the workload's
                                     quantiles, its shared prefixes in its own fraction
    warmup_script(plan)              a standalone Python 3 program (stdlib only) that sends them

The lengths come from the schedule the tuner sends (``workloads.build.build_schedule``),
so a multi-turn chat's later turns count their history, a trace its rows, a mixture
its components. The schedule is sampled without the shared prefix (at least
``SAMPLE_ARRIVALS`` arrivals), its prompt and output lengths are taken at
``QUANTILES`` (5 %, 15 %, ..., 95 %) and paired so that the warm-up sends short and
long prompts alternately, each with an output from the other half of the output
distribution. The workload's system prompts are then put back on the share of these
requests the workload gives them (``shared_prefix.fraction``), its tenants' prompts
in turn: ``WarmupRequest.prompt_tokens`` is the whole prompt, prefix included.

The script (``python3 warmup.py [--url URL] [--probe MARKER] [--timeout-s S]``) cycles
through the plan's requests, ``concurrency`` at a time, until ``max_requests`` are
answered or vLLM's ``vllm:kv_cache_usage_perc`` reaches ``kv_cache_fill``. It sizes each
prompt with the server's ``POST /tokenize`` (about one token a word where it has none).
With ``--probe`` it is a Kubernetes startup probe: exit 1 at once while ``/health``
fails, exit 0 at once when the marker exists, else warm up and write the marker.

Bad arguments are a ``tuner.errors.ConfigError`` of one line naming the value and what
is accepted.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Literal, Self

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    model_validator,
)

from tuner.errors import ConfigError, WorkloadLoadError
from workloads.build import build_schedule
from workloads.prompts import WordPromptBuilder
from workloads.schedule import Api
from workloads.spec import ClosedArrival, WorkloadError, WorkloadSpec

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_REQUESTS",
    "QUANTILES",
    "WarmupPlan",
    "WarmupRequest",
    "warmup_plan",
    "warmup_script",
]

QUANTILES: tuple[float, ...] = tuple((i + 0.5) / 10 for i in range(10))  # 5 %, 15 %, ..., 95 %
SAMPLE_ARRIVALS = 1000  # arrivals (requests, or sessions) the quantiles are taken from
DEFAULT_MAX_REQUESTS = 40  # four passes over the quantiles
DEFAULT_CONCURRENCY = 8


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WarmupRequest(_Frozen):
    """One request of the warm-up: its whole prompt (prefix included) and its answer."""

    prompt_tokens: PositiveInt
    output_tokens: PositiveInt
    prefix: NonNegativeInt | None = None  # index into WarmupPlan.prefixes; None: no prefix


class WarmupPlan(_Frozen):
    """What the warm-up script sends, and when it stops."""

    served_model: str = Field(min_length=1)
    api: Literal["chat", "completions"]
    prefixes: list[PositiveInt]  # tokens of each shared prefix (system prompt)
    requests: list[WarmupRequest] = Field(min_length=1)  # cycled through until a stop
    max_requests: PositiveInt  # stop once this many were sent
    # Stop once the server's vllm:kv_cache_usage_perc reaches this fraction; None: never.
    kv_cache_fill: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    concurrency: PositiveInt  # requests in flight at once

    @model_validator(mode="after")
    def _prefixes_fit(self) -> Self:
        for i, request in enumerate(self.requests):
            if request.prefix is None:
                continue
            if request.prefix >= len(self.prefixes):
                raise ValueError(
                    f"requests[{i}].prefix {request.prefix} is not accepted; accepted: an "
                    f"index below {len(self.prefixes)} (the number of prefixes)"
                )
            if request.prompt_tokens <= self.prefixes[request.prefix]:
                raise ValueError(
                    f"requests[{i}].prompt_tokens {request.prompt_tokens} is not accepted; "
                    f"accepted: more than its prefix's {self.prefixes[request.prefix]} tokens"
                )
        return self


def _check(
    served_model: str, max_requests: int, kv_cache_fill: float | None, concurrency: int
) -> None:
    """Each argument, as one ConfigError naming the value and what is accepted."""
    if not isinstance(served_model, str) or not served_model.strip():
        raise ConfigError(
            f"warm-up served_model {served_model!r} is not accepted; accepted: the model "
            "name the server answers to (--served-model-name, else the model)"
        )
    for name, value in (("max_requests", max_requests), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"warm-up {name} {value!r} is not accepted; accepted: an integer >= 1"
            )
    if kv_cache_fill is not None and (
        isinstance(kv_cache_fill, bool)
        or not isinstance(kv_cache_fill, int | float)
        or not 0.0 < kv_cache_fill <= 1.0
    ):
        raise ConfigError(
            f"warm-up kv_cache_fill {kv_cache_fill!r} is not accepted; accepted: a fraction "
            "in (0, 1] (0.8: stop once the KV cache is 80% full), or None (no fill target)"
        )


def _sampling_spec(spec: WorkloadSpec) -> WorkloadSpec:
    """The workload without its shared prefix, long enough for ``SAMPLE_ARRIVALS`` arrivals."""
    sample = spec.model_copy(update={"shared_prefix": None})
    if isinstance(spec.arrival, ClosedArrival):
        requests = max(spec.arrival.requests, SAMPLE_ARRIVALS)
        return sample.model_copy(
            update={"arrival": spec.arrival.model_copy(update={"requests": requests})}
        )
    rate = spec.mean_rate_per_s
    if rate is None:  # a trace at its recorded pace: the run as it is
        return sample
    return sample.with_duration(max(spec.duration_s, SAMPLE_ARRIVALS / rate))


def _quantiles(values: list[int]) -> list[int]:
    """The values at ``QUANTILES`` (values that occur: no interpolation), each >= 1."""
    picked = np.quantile(np.asarray(values, dtype=np.int64), QUANTILES, method="inverted_cdf")
    return [max(1, int(v)) for v in picked]


def _send_order(n: int) -> list[int]:
    """Ranks 0..n-1 shortest and longest alternately: 0, n-1, 1, n-2, ..."""
    return [k // 2 if k % 2 == 0 else n - 1 - k // 2 for k in range(n)]


def _with_prefix(i: int, n: int, fraction: float) -> bool:
    """Whether the i-th of n requests carries a prefix: round(n * fraction) of them, spread."""
    carried = round(n * fraction)
    return (i + 1) * carried // n > i * carried // n


def warmup_plan(
    spec: WorkloadSpec,
    served_model: str,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    kv_cache_fill: float | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> WarmupPlan:
    """The warm-up of ``spec``'s traffic for a server answering to ``served_model``.

    Ten requests, one per quantile of the prompt lengths the schedule sends (paired with
    the output quantiles half a distribution away), the workload's system prompts on its
    share of them; repeated with the next tenants' prompts while some were not used yet
    (at most until ``max_requests``). The script cycles through them.
    """
    _check(served_model, max_requests, kv_cache_fill, concurrency)
    try:
        schedule = build_schedule(_sampling_spec(spec))
    except WorkloadError as exc:
        raise WorkloadLoadError(f"warm-up of workload {spec.name!r}: {exc}") from exc
    if not schedule:
        raise WorkloadLoadError(
            f"warm-up of workload {spec.name!r}: its schedule holds no request to take "
            "lengths from; accepted: a workload that sends at least one request"
        )
    prompts = _quantiles([r.prompt_tokens for r in schedule])
    outputs = _quantiles([r.max_tokens for r in schedule])
    n = len(QUANTILES)
    base = [(prompts[rank], outputs[(rank + n // 2) % n]) for rank in _send_order(n)]
    shared = spec.shared_prefix
    if shared is None or round(n * shared.fraction) == 0:
        prefixes: list[int] = []
        requests = [WarmupRequest(prompt_tokens=p, output_tokens=o) for p, o in base]
    else:
        prefixes = [shared.system_prompt_tokens] * shared.distinct_prompts
        # What a prefix adds to a prompt: its words, and under chat its message's role.
        extra = shared.system_prompt_tokens
        if spec.api is Api.CHAT:
            extra += WordPromptBuilder.message_overhead_tokens
        # Passes over the ten until every tenant's prompt was sent (as far as max_requests go).
        per_pass = round(n * shared.fraction)
        passes = min(math.ceil(len(prefixes) / per_pass), math.ceil(max_requests / n))
        requests = []
        used = 0  # prefixed requests so far: the tenants' prompts in turn
        for i in range(passes * n):
            prompt, output = base[i % n]
            if _with_prefix(i % n, n, shared.fraction):
                prefix = used % len(prefixes)
                used += 1
                requests.append(
                    WarmupRequest(prompt_tokens=prompt + extra, output_tokens=output, prefix=prefix)
                )
            else:
                requests.append(WarmupRequest(prompt_tokens=prompt, output_tokens=output))
    try:
        return WarmupPlan(
            served_model=served_model,
            api="chat" if spec.api is Api.CHAT else "completions",
            prefixes=prefixes,
            requests=requests,
            max_requests=max_requests,
            kv_cache_fill=kv_cache_fill,
            concurrency=concurrency,
        )
    except ValidationError as exc:  # the checks above let nothing through that lands here
        raise ConfigError(f"warm-up plan: {exc.errors()[0]['msg']}") from exc


def warmup_script(plan: WarmupPlan) -> str:
    """The source of a standalone Python 3 program (stdlib only) that runs ``plan``.

    The plan is a JSON literal inside it (a Python string literal, so any model name is
    safe); see the program's docstring for its command line.
    """
    literal = repr(json.dumps(plan.model_dump(mode="json"), separators=(",", ":")))
    return _SCRIPT.replace("__PLAN_JSON__", literal)


_SCRIPT = r'''#!/usr/bin/env python3
"""Warm a vLLM server up with the measured workload's requests (vllm-capacity-tuner).

    python3 warmup.py [--url URL] [--probe MARKER_PATH] [--timeout-s S]

Sends the plan's requests (prompt and output lengths at the workload's quantiles, its
shared prefixes in its share of requests), `concurrency` at a time, cycling through them
until `max_requests` were sent or the server's vllm:kv_cache_usage_perc (/metrics)
reaches `kv_cache_fill`, or --timeout-s runs out. Each prompt is sized with the server's
POST /tokenize (about one token a word without it); answers are exactly `output_tokens`
long (ignore_eos). VLLM_API_KEY, when set, goes in the Authorization header.

--probe MARKER_PATH (a Kubernetes startup probe, run again until it passes): exit 1 at
once while /health fails, exit 0 at once if the marker exists; else warm up and write it.
Exit status 1 with one line when the server is not healthy or answers an error.
"""

import argparse
import json
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request

PLAN = json.loads(__PLAN_JSON__)

WORDS = (
    "the of and to in is that for it as was with be by on not this are or from at which but "
    "have an they you were there one all we their has been if more when will would who so "
    "out up into do than time some can could other only new these two may first then any "
    "like now such make over even most after also did many before must through years where "
    "much way well down should because each just those people how too little state good "
    "very world still own see work long here get both between life being under never day"
).split()
CALIBRATION_WORDS = 200
USAGE = re.compile(r"^vllm:(?:kv|gpu)_cache_usage_perc(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


def say(text):
    print("warm-up: " + text, flush=True)


class ServerError(Exception):
    """The server answered an error status, or did not answer."""


class Server:
    def __init__(self, url, deadline):
        self.url = url.rstrip("/")
        self.deadline = deadline
        self.headers = {"Content-Type": "application/json"}
        if os.environ.get("VLLM_API_KEY"):
            self.headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]

    def call(self, method, path, body=None, timeout_s=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={**self.headers, **(headers or {})}
        )
        timeout_s = timeout_s or max(self.deadline - time.monotonic(), 1.0)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                error = json.loads(text)
                text = error["error"]["message"] if isinstance(error.get("error"), dict) else text
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
            raise ServerError(
                f"{method} {path} answered HTTP {exc.code}: {text.strip()[:300]}"
            ) from None
        except OSError as exc:  # refused, reset, timed out
            raise ServerError(f"{method} {path} got no answer: {exc}") from None

    def healthy(self):
        try:
            self.call("GET", "/health", timeout_s=5)
            return True
        except ServerError:
            return False

    def kv_cache_usage(self):
        """The KV cache's fill (0-1) from /metrics; None if unreadable."""
        try:
            values = USAGE.findall(self.call("GET", "/metrics", timeout_s=5).decode())
        except ServerError:
            return None
        return max(float(v) for v in values) if values else None


def words(n, seed):
    draw = random.Random(seed).choice
    return " ".join(draw(WORDS) for _ in range(max(n, 1)))


class Prompts:
    """Request bodies whose prompts have the plan's token counts, by the server's /tokenize."""

    def __init__(self, server):
        self.server = server
        self.chat = PLAN["api"] == "chat"
        self.tokens_per_word = 1.0
        self.exact = True
        try:
            sample = {
                "prompt": words(CALIBRATION_WORDS, "calibration"),
                "add_special_tokens": False,
            }
            self.tokens_per_word = max(self.count(sample) / CALIBRATION_WORDS, 0.1)
            say(f"/tokenize: {self.tokens_per_word:.2f} tokens a word")
        except (ServerError, KeyError, TypeError, ValueError) as exc:
            self.exact = False
            say(f"no /tokenize ({exc}); about 1 token a word")
        self.prefixes = [
            words(round(tokens / self.tokens_per_word), f"prefix-{i}")
            for i, tokens in enumerate(PLAN["prefixes"])
        ]

    def count(self, body):
        answer = json.loads(
            self.server.call("POST", "/tokenize", {"model": PLAN["served_model"], **body})
        )
        return int(answer["count"])

    def text(self, prefix, n_words, seed):
        if self.chat:
            messages = [{"role": "system", "content": prefix}] if prefix is not None else []
            return {"messages": [*messages, {"role": "user", "content": words(n_words, seed)}]}
        own = words(n_words, seed)
        return {"prompt": own if prefix is None else prefix + " " + own}

    def body(self, request, number):
        """The prompt part of the number-th request sent (its own words, the plan's length)."""
        prefix = None if request["prefix"] is None else self.prefixes[request["prefix"]]
        target = request["prompt_tokens"]
        prefix_words = 0 if prefix is None else len(prefix.split())
        n_words = max(1, round(target / self.tokens_per_word) - prefix_words)
        seed = f"request-{number}"
        text = self.text(prefix, n_words, seed)
        for _ in range(4 if self.exact else 0):  # a word more or less until /tokenize agrees
            step = round((target - self.count(text)) / self.tokens_per_word)
            if step == 0 or n_words + step < 1:
                break
            n_words += step
            text = self.text(prefix, n_words, seed)
        return text


class WarmUp:
    def __init__(self, server, prompts):
        self.server = server
        self.prompts = prompts
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sent = self.answered = self.prompt_tokens = self.output_tokens = 0
        self.error = None
        self.peak = None  # the KV cache's highest fill seen in /metrics
        self.run_id = os.urandom(3).hex()

    def next_number(self):
        with self.lock:
            if self.stop.is_set() or self.sent >= PLAN["max_requests"]:
                return None
            self.sent += 1
            return self.sent - 1

    def worker(self):
        path = "/v1/chat/completions" if PLAN["api"] == "chat" else "/v1/completions"
        while (number := self.next_number()) is not None:
            request = PLAN["requests"][number % len(PLAN["requests"])]
            body = {
                "model": PLAN["served_model"],
                "max_tokens": request["output_tokens"],
                "ignore_eos": True,
                "temperature": 0,
                "stream": False,
            }
            headers = {"X-Request-Id": f"warmup-{self.run_id}-{number}"}
            try:
                body.update(self.prompts.body(request, number))
                answer = json.loads(self.server.call("POST", path, body, headers=headers))
                usage = answer.get("usage") or {}
            except (ServerError, ValueError, KeyError, TypeError) as exc:
                if time.monotonic() < self.server.deadline:  # past it: the time limit, no error
                    with self.lock:
                        self.error = self.error or f"request {number}: {exc}"
                self.stop.set()
                return
            with self.lock:
                self.answered += 1
                self.prompt_tokens += usage.get("prompt_tokens") or 0
                self.output_tokens += usage.get("completion_tokens") or 0

    def run(self):
        """Send until a stop; returns why it stopped."""
        target = PLAN["kv_cache_fill"]
        threads = [
            threading.Thread(target=self.worker, daemon=True) for _ in range(PLAN["concurrency"])
        ]
        for thread in threads:
            thread.start()
        reason = f"max_requests {PLAN['max_requests']} sent"
        milestone = max(PLAN["max_requests"] // 4, 1)
        shown = 0
        while any(thread.is_alive() for thread in threads):
            usage = self.server.kv_cache_usage()
            if usage is not None:
                self.peak = max(self.peak or 0.0, usage)
                if target is not None and usage >= target and not self.stop.is_set():
                    reason = f"KV cache {usage:.0%} full, target {target:.0%} reached"
                    self.stop.set()
            if time.monotonic() >= self.server.deadline:
                self.stop.set()
                return f"time limit reached, {self.sent - self.answered} request(s) in flight"
            if self.answered >= shown + milestone:
                shown = self.answered // milestone * milestone
                fill = "" if usage is None else f", KV cache {usage:.0%} full"
                say(f"{self.answered} of {PLAN['max_requests']} requests answered{fill}")
            time.sleep(0.2)
        return reason


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)"
    )
    parser.add_argument(
        "--probe", metavar="MARKER_PATH", help="run as a startup probe; the marker says it is done"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=600.0, help="seconds for it all; at the limit it ends as done (default: %(default)s)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    server = Server(args.url, started + args.timeout_s)
    if args.probe:
        if not server.healthy():
            say(f"{server.url}/health does not answer yet")
            return 1
        if os.path.exists(args.probe):
            return 0
    else:
        while not server.healthy():
            if time.monotonic() >= server.deadline:
                say(f"failed: {server.url}/health did not answer within {args.timeout_s:g} s")
                return 1
            time.sleep(1.0)
    say(
        f"{server.url} healthy; sending {PLAN['api']} requests to {PLAN['served_model']}, "
        f"{PLAN['concurrency']} at a time"
    )
    warm_up = WarmUp(server, Prompts(server))
    reason = warm_up.run()
    if warm_up.error:
        say(f"failed: {warm_up.error}")
        return 1
    peak = "" if warm_up.peak is None else f", KV cache at most {warm_up.peak:.0%} full"
    say(
        f"done: {warm_up.answered} requests answered ({warm_up.prompt_tokens} prompt and "
        f"{warm_up.output_tokens} output tokens) in {time.monotonic() - started:.1f} s{peak}; "
        f"stopped: {reason}"
    )
    if args.probe:
        os.makedirs(os.path.dirname(os.path.abspath(args.probe)), exist_ok=True)
        open(args.probe, "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
