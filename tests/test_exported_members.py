"""One public surface: everything users need is importable from ``raf``, nothing else is."""

from __future__ import annotations

import inspect
import subprocess
import sys

import raf
import raf.errors


def test_all_is_exactly_the_sorted_public_names() -> None:
    assert raf.__all__ == sorted(raf.__all__)
    assert len(set(raf.__all__)) == len(raf.__all__)
    for name in raf.__all__:
        assert hasattr(raf, name), name
    public = {name for name in vars(raf) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(raf, name))}
    assert public - modules == set(raf.__all__)


def test_every_error_class_is_exported() -> None:
    classes = {
        name
        for name, value in vars(raf.errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")
    }
    assert classes == set(raf.errors.__all__)
    assert classes <= set(raf.__all__)


def test_internal_helpers_are_not_exported() -> None:
    assert "EMPTY_RESULT" not in raf.__all__
    assert "Messages" not in raf.__all__
    for module in (
        "raf.pipeline",
        "raf.providers",
        "raf.context",
        "raf.messages",
        "raf.observe",
        "raf.tracing",
    ):
        exported = set(__import__(module, fromlist=["__all__"]).__all__)
        assert exported <= set(raf.__all__) | {"Role"}, module


def test_import_raf_imports_no_optional_extra() -> None:
    code = (
        "import sys, raf; "
        "print(sorted(m for m in ('hypothesis', 'coredis', 'opentelemetry', 'mcp') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_raf_imports_no_sdk_stack() -> None:
    # The OpenAI clients, @tool's schemas and the tool checks import these when first
    # used; an offline agent (Echo, Scripted, a plain Tool) never pays for them.
    heavy = ("openai", "httpx", "httpx2", "pydantic", "pydantic_core", "jsonschema")
    code = f"import raf, sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_openai_clients_load_on_first_use() -> None:
    code = (
        "import raf, sys; "
        "before = 'raf.clients.openai' in sys.modules; "
        "chat, responses = raf.OpenAIChatClient, raf.OpenAIResponsesClient; "
        "print(before, chat.__module__, responses.__module__, 'OpenAIChatClient' in vars(raf))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "raf.clients.openai", "raf.clients.responses", "True"]
