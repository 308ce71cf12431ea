"""Model calls: the backends a kind's items go through (``backends``: the offline one and the
choice; ``openai_backend``: any OpenAI-compatible server through the official SDK) and the
limits every worker calling one model shares in Redis (``rate``: requests and tokens per
minute; ``concurrency``: the adaptive number of calls at once)."""
