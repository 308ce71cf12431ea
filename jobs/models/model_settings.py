"""The LEASH_MODEL_* settings every backend shares, apart from the call loop
(jobs/models/calls.py) so that what the loop is built from (spending.py) can name them without
importing the loop: no import loop, not even one for the type checker."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.config import model_calls
from jobs.errors import PermanentError


@dataclass(frozen=True)
class ModelSettings:
    """The LEASH_MODEL_* settings (declared in jobs/config/), which every backend shares."""

    url: str | None
    name: str
    api_key: str
    timeout: float
    max_inline_wait: float
    rpm: float
    tpm: float
    temperature: float | None
    max_tokens: int = 1024

    @property
    def connect_timeout(self) -> float:
        return min(self.timeout, 10.0)

    @classmethod
    def from_env(cls) -> ModelSettings:
        try:
            calls = model_calls()
        except ValueError as exc:  # a setting no retry can fix
            raise PermanentError(str(exc)) from None
        name = (calls.model_name or "").strip()
        if not name:
            raise PermanentError("LEASH_MODEL_NAME is not set: name the model to call (e.g. gpt-4o-mini, llama3.1)")
        return cls(
            url=(calls.model_url or "").strip() or None,
            name=name,
            api_key=(calls.model_api_key or "").strip() or "no-key",  # local servers ignore it; SDKs want one
            timeout=calls.model_timeout,
            max_inline_wait=calls.model_max_inline_wait,
            rpm=calls.model_rpm,
            tpm=calls.model_tpm,
            temperature=calls.model_temperature,
            max_tokens=calls.model_max_tokens,
        )
