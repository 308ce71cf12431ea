"""Money: what every model call used and cost, and the budgets that stop a job or an owner
before it spends past a line.

    a call is admitted   model_admit_v3: its turn on the model's rate limit, the attempt's
                         lease, and its worst case (prompt estimate + max_tokens) reserved
                         against the job's budget and the owner's daily budget -- one
                         reservation per call, with an id, the UTC day it was made on and a
                         deadline after which the call can no longer be paid for; the owner's
                         reservations past their deadline are given back first (a few a call)
    it is sent again     after a 429: a new rate turn, the same reservation
    the call returns     its usage (the server's figures, or an estimate marked as such) and
                         its cost (jobs.usage.prices) wait on the item's thread (Meter), with
                         the reservation's id, apart per model and per day
    the item is stored   heartbeat_v4 writes the item, its usage, and adds the usage to the
                         job, the attempt, the owner's day of the admission and the model,
                         settling the reservations it names (once: a repeat finds them gone)
                         -- one script, one round trip, as before
    no item to store     usage_record_v3 counts it all the same (paid is paid)
    a provider batch     one reservation per part (budget.batch_reservation), kept by later
                         attempts, settled by the part's last write, its answers counted on
                         its day; given back when the job stops or the batch is left unread

Costs are integers in nano-USD (1e-9 USD) so Redis adds them exactly; a price "per 1M tokens"
is micro-USD per token, i.e. 1,000 nano-USD per token per dollar of price.
"""
