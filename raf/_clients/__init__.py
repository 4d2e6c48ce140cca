"""Chat clients: the real OpenAI ones and the offline ones.

Nothing is imported here: `raf` loads each client's module when it is first used, so
that `import raf` imports none of the SDK's stack (openai, httpx, pydantic).
"""
