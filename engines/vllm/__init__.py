"""vLLM as a first-class target: deployment profiles, argument checks, launcher, tiny models."""

from agent_replay.engines.vllm.profiles import (
    PROFILES,
    Command,
    Deployment,
    Profile,
    build,
    get_profile,
)

__all__ = ["PROFILES", "Command", "Deployment", "Profile", "build", "get_profile"]
