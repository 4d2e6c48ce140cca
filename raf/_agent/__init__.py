"""The agent: the run, the tool loop, tools, deferred calls, structured output and streaming."""
