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
    """The same work as leash's ``one_item`` kind (benchmarks/chaos_kinds.py), without leash."""
    return {"items": [str(item).upper() for item in payload["items"]]}


def batch_and_wait(url, model, items, poll, results_key):
    """A batch job the plain way: create the provider batch, sleep and poll in the work-horse
    until it ends (holding the worker all along), then store every answer."""
    import io
    import json

    import openai
    from rq import get_current_job

    client = openai.OpenAI(base_url=url, api_key="bench", max_retries=3)
    lines = "".join(json.dumps({"custom_id": f"item-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": model, "max_tokens": 64,
                                         "messages": [{"role": "user", "content": f"Say item-{i}"}]}}) + "\n"
                    for i in range(items))
    upload = client.files.create(file=("batch.jsonl", io.BytesIO(lines.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(poll)
        batch = client.batches.retrieve(batch.id)
    connection = get_current_job().connection
    with connection.pipeline(transaction=False) as pipe:
        for line in client.files.content(batch.output_file_id).text.splitlines():
            result = json.loads(line)
            pipe.hset(results_key, result["custom_id"], json.dumps(result["response"]["body"]["choices"][0]))
        pipe.execute()
    return {}
