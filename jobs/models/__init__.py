"""Model calls: the backends a kind's items go through (``backends``: the registry, the choice and
the offline one), the one call loop every other backend runs on (``calls``, in the terms of
``provider``), a provider module per SDK (``openai_backend``: any OpenAI-compatible server), and
the limits every worker calling one model shares in Redis (``rate``: requests and tokens per
minute; ``concurrency``: the adaptive number of calls at once)."""
