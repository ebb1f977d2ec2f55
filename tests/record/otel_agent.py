"""A small agent on the real ``openai`` client, instrumented with a real OpenTelemetry
instrumentation and exporting spans through the real OTLP/HTTP exporter (protobuf).

    python otel_agent.py BASE_URL OTLP_ENDPOINT (openai-v2|openinference)[+http] TURNS

``+http`` adds opentelemetry-instrumentation-httpx (and hands the client an
``httpx.Client``): an HTTP client span under each LLM span, whose start is when the
request left the client.

One session: a root span, then TURNS chat turns on a growing conversation with a pause (the
"tool") between them; the last turn streams. Prints one JSON line per request: the
client's send time (ns since the epoch) and the usage the server reported."""

from __future__ import annotations

import json
import sys
import time

from openai import OpenAI
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def main() -> None:
    base_url, endpoint, kind, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    kind, http = kind.removesuffix("+http"), kind.endswith("+http")
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-agent"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces"))
    )
    trace.set_tracer_provider(provider)
    if kind == "openai-v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
    else:
        from openinference.instrumentation.openai import OpenAIInstrumentor as OI

        OI().instrument(tracer_provider=provider)
    if http:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    more = {}
    if http:  # openai 3 sends through httpx2, which the httpx instrumentation does not see
        import httpx

        more["http_client"] = httpx.Client()
    client = OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0, **more)
    msgs = [
        {"role": "system", "content": "You are a coding agent. " * 30},
        {"role": "user", "content": "Find the bug in parse(). " * 20},
    ]
    tracer = trace.get_tracer("otel-agent")
    with tracer.start_as_current_span("session"):
        for turn in range(turns):
            sent = time.time_ns()
            if turn < turns - 1:
                r = client.chat.completions.create(model="sim-fast", messages=msgs, max_tokens=16)
                usage = r.usage
                text = r.choices[0].message.content or ""
            else:
                usage, parts = None, []
                for c in client.chat.completions.create(
                    model="sim-fast",
                    messages=msgs,
                    max_tokens=16,
                    stream=True,
                    stream_options={"include_usage": True},
                ):
                    if c.choices and c.choices[0].delta.content:
                        parts.append(c.choices[0].delta.content)
                    if c.usage is not None:
                        usage = c.usage
                text = "".join(parts)
            assert usage is not None
            print(
                json.dumps(
                    {
                        "sent_ns": sent,
                        "input": usage.prompt_tokens,
                        "output": usage.completion_tokens,
                    }
                ),
                flush=True,
            )
            msgs += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"tool output {turn}: " + "ok " * 40},
            ]
            time.sleep(0.15)  # the tool runs
    provider.shutdown()


if __name__ == "__main__":
    main()
