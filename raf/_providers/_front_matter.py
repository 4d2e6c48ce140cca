"""FrontMatterLoader: PyYAML's safe loader for a SKILL.md front matter, refusing duplicate keys."""

from __future__ import annotations

from typing import Any

import yaml

__all__: list[str] = []


class DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one mapping of the front matter."""


class FrontMatterLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise DuplicateKey(None, None, f"{key!r} is given twice", key_node.start_mark)
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)
