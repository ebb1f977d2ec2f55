"""A model's reply as the recorder matches it: see ``engines.replies`` (its one home, shared
with the API dialects, which read replies out of responses)."""

from __future__ import annotations

from agent_replay.engines.replies import Reply, is_reply_item, reply_from_items

__all__ = ["Reply", "is_reply_item", "reply_from_items"]
