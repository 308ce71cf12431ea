"""Money: what every model call used and cost, and the budgets that stop a job or an owner
before it spends past a line.

    a call is admitted   model_admit_v1: its turn on the model's rate limit, the attempt's
                         lease, and its worst case (prompt estimate + max_tokens) reserved
                         against the job's budget and the owner's daily budget
    the call returns     its usage (the server's figures, or an estimate marked as such) and
                         its cost (jobs.usage.prices) wait on the item's thread (Meter)
    the item is stored   heartbeat_v3 writes the item, its usage, and adds the usage to the
                         job, the attempt, the owner's UTC day and the model, settling the
                         reservation -- one script, one round trip, as before
    no item to store     usage_record_v2 counts it all the same (paid is paid)

Costs are integers in nano-USD (1e-9 USD) so Redis adds them exactly; a price "per 1M tokens"
is micro-USD per token, i.e. 1,000 nano-USD per token per dollar of price.
"""
