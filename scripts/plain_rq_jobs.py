"""Plain RQ job functions: the baseline the lifecycle benchmark compares leash against.

Kept in a module of their own that imports almost nothing: a plain RQ work-horse imports the
function's module after the fork, so a heavy module would be charged to RQ on every job.
"""

import time


def noop(kind_name, payload):
    return {}


def sleep(kind_name, payload):
    time.sleep(float(payload.get("seconds", 60)))
    return {}
