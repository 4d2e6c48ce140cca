"""One TLS context for the tests' HTTP clients of loopback servers.

An httpx client (or an SDK client, which makes one) built without ``verify=`` reads
the whole certificate store, about 35 ms of CPU, though the tests speak plain HTTP to
127.0.0.1; given this context, made once per process, it takes about 0.4 ms. It is
httpx's default context, so such a client behaves as one built without it.
"""

from __future__ import annotations

import httpx2

__all__ = ["TLS"]

#: httpx's default TLS context (the system's certificates, ``SSL_CERT_FILE``), made once.
TLS = httpx2.create_ssl_context()
