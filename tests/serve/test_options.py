"""ServeOptions: one frozen value of how an app serves, each option checked where it is defined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from raf._cli_args import build_parser
from raf.errors import ConfigError
from raf.serve import ServeOptions


def test_the_defaults() -> None:
    options = ServeOptions()
    assert (options.store, options.api_keys, options.max_body) == (None, None, 4 * 1024 * 1024)
    assert (options.allowed_hosts, options.allowed_origins, options.cors_origins) == ((), (), ())
    assert (options.body_timeout, options.write_timeout) == (30.0, 30.0)
    assert (options.mcp, options.a2a, options.manage_agent) == (False, False, False)


def test_lists_become_tuples_and_the_value_is_frozen() -> None:
    options = ServeOptions(api_keys=["a", "b"], allowed_hosts=["h.example"], cors_origins=None)
    assert (options.api_keys, options.allowed_hosts, options.cors_origins) == (
        ("a", "b"),
        ("h.example",),
        (),
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.max_body = 1  # type: ignore[misc]
    assert attrs.evolve(options, max_body=10).max_body == 10


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"max_body": 0}, "max_body must be a positive int of bytes, got 0"),
        ({"max_body": 1.5}, "max_body must be a positive int of bytes, got 1.5"),
        ({"body_timeout": 0}, "body_timeout must be a positive number of seconds, got 0"),
        ({"write_timeout": True}, "write_timeout must be a positive number of seconds, got True"),
        ({"api_keys": "one-key"}, "api_keys must be a list of keys, not one string"),
        ({"api_keys": []}, "api_keys must be non-empty strings (or None for no keys)"),
        ({"allowed_hosts": "h.example"}, "allowed_hosts must be a list of names, not one string"),
        ({"allowed_origins": [""]}, "allowed_origins must be non-empty strings"),
        ({"cors_origins": "https://a.example"}, "cors_origins must be a list of names"),
        ({"mcp": "false"}, "mcp must be True or False, got 'false'"),
        ({"a2a": 1}, "a2a must be True or False, got 1"),
        ({"manage_agent": None}, "manage_agent must be True or False, got None"),
        ({"store": 123}, "store must be a session store (with await store.get(id))"),
        ({"store": ""}, "store must be a session store"),
        # urlsplit's own errors, a port out of range, spaces, and credentials for the card.
        ({"public_url": "http://[::1/"}, "public_url must be an http:// or https:// URL"),
        ({"public_url": "http://h.example:99999"}, "public_url must be an http:// or https://"),
        ({"public_url": "http://h.example:x/"}, "public_url must be an http:// or https://"),
        ({"public_url": "https://h.example/a b"}, "public_url must be an http:// or https://"),
        ({"public_url": "https://u:p@h.example/"}, "public_url must be an http:// or https://"),
    ],
)
def test_a_wrong_option_is_a_config_error_naming_it(given: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServeOptions(**given)
    assert said in str(caught.value)


def test_raf_serve_parses_its_options_as_serve_options_names() -> None:
    # Each option of `raf serve` is a field of ServeOptions or the command's own (serve()'s):
    # a served option is defined once, in ServeOptions, with its default there.
    command = {"command", "config", "host", "port", "workers", "grace", "api_key_file"}
    fields = {field.name for field in attrs.fields(ServeOptions)}
    bare = vars(build_parser().parse_args(["serve", "agent.toml"]))
    assert set(bare) == command  # left out, an option takes ServeOptions' default
    argv = [
        "serve", "agent.toml", "--db", "s.db", "--api-key", "k1", "--api-key", "k2",
        "--allowed-host", "h.example", "--allowed-origin", "https://o.example",
        "--mcp", "--a2a", "--body-timeout", "5", "--write-timeout", "6",
    ]  # fmt: skip
    given = vars(build_parser().parse_args(argv))
    assert set(given) - command <= fields
    options = ServeOptions(**{name: given[name] for name in set(given) & fields})
    assert options == ServeOptions(
        store="s.db",
        api_keys=("k1", "k2"),
        allowed_hosts=("h.example",),
        allowed_origins=("https://o.example",),
        mcp=True,
        a2a=True,
        body_timeout=5.0,
        write_timeout=6.0,
    )
    assert given["config"] == Path("agent.toml")
