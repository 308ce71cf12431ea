"""A backend's batch side: the providers' batch APIs (OpenAI's, Anthropic's) behind one interface
(batching.py: create a batch of a job's items, look at it, read its answers, cancel it)."""
