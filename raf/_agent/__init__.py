"""The agent: the run, the tool loop, tools, approvals, structured output and streaming."""
