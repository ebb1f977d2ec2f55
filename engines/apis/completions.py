"""OpenAI completions (``/v1/completions``): a prompt of text or token ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_replay.engines.apis.openai import OpenAIDialect


class Completions(OpenAIDialect):
    name = "completions"
    route = "/v1/completions"
    token_ids = True
    id_prefix = "cmpl-"
    prompt_fields = ("prompt",)

    def _fill(self, body: dict[str, Any], model: str, prompt: Any, max_tokens: int) -> None:
        body["model"] = model
        body["stream"] = True
        body["prompt"] = prompt
        body["max_tokens"] = max_tokens

    def recorded_prompt(self, body: Mapping[str, Any]) -> Any:
        return body.get("prompt")

    def prompt(self, body: Mapping[str, Any]) -> Any:
        return body.get("prompt")


DIALECT = Completions()
