"""Usage: the token counts of one or more model calls."""

from __future__ import annotations

import attrs

__all__ = ["Usage"]


@attrs.frozen(slots=True, repr=False)
class Usage:
    """Token counts of one or more model calls; ``+`` adds them up.

    ``cached_input_tokens`` is the part of ``input_tokens`` the provider read
    from its prompt cache, ``cache_write_tokens`` the part it wrote to its
    cache (Anthropic bills it higher), ``reasoning_tokens`` the part of
    ``output_tokens`` a reasoning model spent thinking; each is 0 when the
    client does not report it.

    >>> Usage(10, 2, cached_input_tokens=8) + Usage(5, 1)
    Usage(input_tokens=15, output_tokens=3, cached_input_tokens=8)
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = attrs.field(default=0, kw_only=True)
    reasoning_tokens: int = attrs.field(default=0, kw_only=True)
    cache_write_tokens: int = attrs.field(default=0, kw_only=True)

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    def __repr__(self) -> str:
        # The breakdowns only when there is one: most clients report none.
        text = f"Usage(input_tokens={self.input_tokens}, output_tokens={self.output_tokens}"
        if self.cached_input_tokens:
            text += f", cached_input_tokens={self.cached_input_tokens}"
        if self.cache_write_tokens:
            text += f", cache_write_tokens={self.cache_write_tokens}"
        if self.reasoning_tokens:
            text += f", reasoning_tokens={self.reasoning_tokens}"
        return text + ")"
