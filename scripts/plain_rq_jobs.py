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


def one_model_call(url, model, prompt):
    """One chat completion, as a plain RQ job calling a model would do it (the SDK is imported
    inside the work-horse, as a plain ``rq worker`` does for the function's module)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}])
    return answer.choices[0].message.content


def classify(items, labels):
    """One label per item, as a plain RQ job would return them (the memory benchmark)."""
    return [{"index": i, "label": labels[len(text) % len(labels)]} for i, text in enumerate(items)]


def one_item(kind_name, payload):
    """The same work as leash's ``one_item`` kind (scripts/chaos_kinds.py), without leash."""
    return {"items": [str(item).upper() for item in payload["items"]]}
