"""The built-in context providers, one module per kind.

Nothing is imported here: `raf` loads each module when one of its names is first used,
so that an agent without, say, the knowledge provider never pays for it.
"""
