"""What a kind's function gets while its job runs: the context (``ctx``), its items run several at
once (``ctx.for_each``) and side effects run once per job."""
