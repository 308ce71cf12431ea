"""Reaching Redis: the connection (and what REDIS_URL may be), the data layout's version and its
migrations, and riding out a Redis that is full."""
