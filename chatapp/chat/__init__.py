"""The conversation core: the session (the cache invariant), the command table, the events, the calculator tool."""
