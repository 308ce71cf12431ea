"""The Lua scripts, loaded and run with their keys by name (``scripts``), and every transition
that changes a job (``transitions``): below every other layer but the key names."""
