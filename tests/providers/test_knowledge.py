"""KnowledgeProvider (folder BM25 and wiki) through real Agent runs."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    ChatMessage,
    FolderRetriever,
    InMemorySession,
    KnowledgeProvider,
    Passage,
    ScriptedChatClient,
    WikiRetriever,
)
from raf._providers import knowledge
from raf._providers.knowledge import BM25Index, split_passages, tokenize
from raf.errors import ConfigError

pytestmark = pytest.mark.anyio


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    (folder / "network").mkdir(parents=True)
    (folder / "network" / "router.md").write_text(
        "# Router\n\nTo reset the router, hold the reset button for ten seconds.\n\n"
        "# Wi-Fi\n\nThe Wi-Fi password is on the sticker under the router.\n"
    )
    (folder / "kitchen.txt").write_text("The coffee machine needs descaling every month.\n")
    (folder / "image.png").write_bytes(b"\x89PNG reset router")
    (folder / "latin1.md").write_bytes("caf\xe9 reset".encode("latin-1"))
    (folder / ".hidden.md").write_text("reset router secret")
    return folder


async def test_passages_for_the_last_user_message_are_injected_with_sources(docs: Path) -> None:
    client = ScriptedChatClient(["Hold the button."])
    agent = Agent(client, stack=[KnowledgeProvider.folder(docs, top_k=2)])
    await agent.run(
        [ChatMessage.user("tell me about coffee"), ChatMessage.user("How do I reset the router?")]
    )
    system = client.requests[0].messages[0].content or ""
    assert "[1] source: network/router.md:1" in system
    assert "hold the reset button for ten seconds" in system
    assert "coffee" not in system  # only the last user message is the query
    for skipped in ("secret", "PNG", "café"):  # hidden, binary, not UTF-8
        assert skipped not in system


async def test_passages_are_volatile_they_come_after_the_history_and_are_not_stored(
    docs: Path,
) -> None:
    client = ScriptedChatClient(["Hold the button.", "Descale it."])
    agent = Agent(
        client, instructions="Be brief.", stack=[KnowledgeProvider.folder(docs)], history=True
    )
    session = InMemorySession()
    await agent.run("How do I reset the router?", session=session)
    await agent.run("And the coffee machine?", session=session)
    sent = client.requests[1]
    # The system message is the agent's alone, the same on every turn; the passages of
    # this question sit between the history and the question.
    assert sent.messages[0] == ChatMessage.system("Be brief.")
    assert [m.role for m in sent.messages] == ["system", "user", "assistant", "system", "user"]
    assert "descaling" in (sent.messages[3].content or "")
    assert sent.options.history_end == 3
    stored = await session.get_messages()
    assert not any("source:" in (m.content or "") for m in stored)


async def test_volatile_false_keeps_the_passages_in_the_system_message(docs: Path) -> None:
    client = ScriptedChatClient(["ok"])
    stack = [KnowledgeProvider.folder(docs, volatile=False)]
    await Agent(client, instructions="Be brief.", stack=stack).run("reset the router?")
    first, request = client.requests[0].messages
    assert (first.content or "").startswith("Be brief.\nPassages from the knowledge base")
    assert request == ChatMessage.user("reset the router?")
    with pytest.raises(TypeError, match="volatile"):
        KnowledgeProvider(FolderRetriever(docs), volatile="no")  # type: ignore[arg-type]


async def test_nothing_matches_nothing_injected(docs: Path) -> None:
    client = ScriptedChatClient(["?", "?"])
    agent = Agent(client, stack=[KnowledgeProvider.folder(docs)])
    await agent.run("quantum chromodynamics")
    await agent.run("what is the")  # stopwords only
    assert all(m.role == "user" for m in client.requests[0].messages)
    assert all(m.role == "user" for m in client.requests[1].messages)


async def test_a_custom_retriever_plugs_in() -> None:
    class Fixed:
        async def retrieve(self, query: str, top_k: int) -> list[Passage]:
            return [Passage(f"about {query}", "memo", 1.0)][:top_k]

    client = ScriptedChatClient(["ok"])
    provider = KnowledgeProvider(Fixed(), top_k=1, name="memo")
    await Agent(client, stack=[provider]).run("llamas")
    assert "[1] source: memo\nabout llamas" in (client.requests[0].messages[0].content or "")
    assert provider.kind == "knowledge"


async def test_refresh_sees_new_files(docs: Path) -> None:
    retriever = FolderRetriever(docs)
    assert await retriever.retrieve("zebra", 3) == []
    (docs / "zoo.md").write_text("A zebra has stripes.")
    assert await retriever.retrieve("zebra", 3) == []  # the index is kept ...
    await retriever.refresh()
    assert [p.source for p in await retriever.retrieve("zebra", 3)] == ["zoo.md:1"]


def test_bm25_prefers_rarer_terms_and_shorter_passages() -> None:
    index = BM25Index(
        [
            Passage("router router router manual", "a"),
            Passage("router reset", "b"),
            Passage("router " + "filler " * 40 + "reset", "c"),
        ]
    )
    ranked = index.search("reset router", 3)
    assert [p.source for p in ranked] == ["b", "c", "a"]
    assert all(p.score > 0 for p in ranked)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="abc \n", max_size=40), min_size=1, max_size=8), st.text("abc "))
def test_bm25_scores_are_finite_ranked_and_only_for_shared_terms(
    texts: list[str], query: str
) -> None:
    index = BM25Index(Passage(t, str(i)) for i, t in enumerate(texts))
    results = index.search(query, len(texts))
    scores = [p.score for p in results]
    assert scores == sorted(scores, reverse=True)
    assert all(math.isfinite(s) and s > 0 for s in scores)
    terms = set(tokenize(query))
    for passage in results:
        assert terms & set(tokenize(passage.text))


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet="ab #\n", max_size=300), st.integers(5, 80))
def test_split_passages_keeps_every_word(text: str, chunk_chars: int) -> None:
    passages = split_passages(text, "f", chunk_chars)
    assert " ".join(p.text for p in passages).split() == text.split()
    lines = text.splitlines()
    for passage in passages:
        first = int(passage.source.rsplit(":", 1)[1]) - 1
        assert lines[first] == passage.text.splitlines()[0]


@pytest.fixture
def wiki(tmp_path: Path) -> Path:
    folder = tmp_path / "wiki"
    folder.mkdir()
    (folder / "Espresso.md").write_text(
        "# Espresso\n\nEspresso is brewed under pressure. See [[Grinder Settings|the grinder]] "
        "and [[milk-frothing#steam]] and [[Missing Page]].\n"
    )
    (folder / "grinder_settings.md").write_text("# Grinder\n\nUse a fine grind, setting 3.\n")
    (folder / "Milk Frothing.md").write_text("# Milk\n\nSteam the milk to 60 degrees.\n")
    (folder / "Tea.md").write_text("# Tea\n\nSteep green tea for two minutes. [[Espresso]]\n")
    return folder


async def test_wiki_follows_links_one_hop(wiki: Path) -> None:
    client = ScriptedChatClient(["ok"])
    provider = KnowledgeProvider.wiki(wiki, top_k=1)
    assert provider.kind == "wiki"
    await Agent(client, stack=[provider]).run("how is espresso brewed")
    system = client.requests[0].messages[0].content or ""
    assert "[1] source: Espresso.md:1" in system
    assert "[2] source: grinder_settings.md:1 (linked from Espresso.md)" in system
    assert "fine grind" in system
    # only top_k linked passages are added, and links of linked pages are not followed
    assert "Steam the milk" not in system
    assert "Tea" not in system


async def test_wiki_links_resolve_names_loosely_and_skip_missing_pages(wiki: Path) -> None:
    passages = await WikiRetriever(wiki).retrieve("espresso pressure", 3)
    sources = [p.source for p in passages]
    assert sources[0] == "Espresso.md:1"
    assert "grinder_settings.md:1 (linked from Espresso.md)" in sources
    assert "Milk Frothing.md:1 (linked from Espresso.md)" in sources
    assert not any("Missing" in s for s in sources)
    assert len(sources) == len(set(sources))


def test_roots_and_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="knowledge root"):
        KnowledgeProvider.folder(tmp_path / "missing")
    with pytest.raises(ConfigError, match="wiki root"):
        KnowledgeProvider.wiki(tmp_path / "missing")
    with pytest.raises(ValueError, match="top_k"):
        KnowledgeProvider.folder(tmp_path, top_k=0)
    with pytest.raises(TypeError, match="retrieve"):
        KnowledgeProvider(object())  # type: ignore[arg-type]


def test_a_comment_in_a_code_block_is_not_a_heading() -> None:
    text = "# Setup\nRun this:\n```sh\n# wipe the cache\nmake clean\n```\nThen start it.\n"
    passages = split_passages(text, "setup.md", chunk_chars=1000)
    assert [p.source for p in passages] == ["setup.md:1"]
    assert passages[0].text == text.strip()


def test_only_hashes_followed_by_a_space_start_a_heading() -> None:
    text = "# Tags\nfirst\n\n#hashtag and #42 are words\n\n## Next\nsecond"
    assert [p.source for p in split_passages(text, "t.md", chunk_chars=1000)] == [
        "t.md:1",
        "t.md:6",
    ]


def test_singular_and_plural_match() -> None:
    index = BM25Index(
        [Passage("Refunds take five business days.", "billing.md:6"), Passage("cats", "c")]
    )
    assert [p.source for p in index.search("How do I get a refund?", 3)] == ["billing.md:6"]
    assert tokenize("queries boxes refunds glass bus") == tokenize("query box refund glass bus")


@contextlib.contextmanager
def rescued_after(fifo: Path, seconds: float) -> Iterator[list[bool]]:
    """If the test still runs after ``seconds``, open ``fifo`` to free a reader blocked on it.

    Yields a flag that says whether that was needed: a bounded way to prove
    "never blocks" that leaves no thread stuck when it fails.
    """
    done = threading.Event()
    rescued = [False]

    def watch() -> None:
        if not done.wait(seconds):
            rescued[0] = True
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield rescued
    finally:
        done.set()
        thread.join()


@pytest.mark.parametrize("make", [KnowledgeProvider.folder, KnowledgeProvider.wiki])
async def test_only_regular_files_beneath_the_root_are_read(
    docs: Path, outside: Path, make: Callable[[Path], KnowledgeProvider]
) -> None:
    (outside / "leak.md").write_text("# Router\n\nreset router top secret")
    (docs / "link-out.md").symlink_to(outside / "leak.md")
    (docs / "dir-out").symlink_to(outside, target_is_directory=True)
    (docs / "alias.md").symlink_to(docs / "network" / "router.md")
    os.link(outside / "secret.txt", docs / "hard.md")
    os.mkfifo(docs / "pipe.md")
    client = ScriptedChatClient(["ok"])
    with rescued_after(docs / "pipe.md", 30) as rescued:
        await Agent(client, stack=[make(docs)]).run("reset the router, top secret")
    assert rescued == [False], "reading the knowledge folder blocked on a FIFO"
    system = client.requests[0].messages[0].content or ""
    assert "top secret" not in system
    assert "source: network/router.md:1" in system or make is KnowledgeProvider.wiki
    for skipped in ("alias.md", "link-out", "dir-out"):  # symlinks, even to a file inside
        assert skipped not in system


ZERO_PROBE = """
import resource, sys
# Unsafe code reads /dev/zero until memory runs out: make that a MemoryError here.
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from raf import FolderRetriever, WikiRetriever
print([p.source for p in FolderRetriever(sys.argv[1])._build().passages])
print([p.source for p in WikiRetriever(sys.argv[1])._build().index.passages])
"""


def test_a_symlink_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "z.md").symlink_to("/dev/zero")
    (tmp_path / "page.md").write_text("a page")
    done = subprocess.run(
        [sys.executable, "-c", ZERO_PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["['page.md:1']", "['page.md:1']"]


def test_a_file_is_read_only_up_to_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "small.md").write_text("zebra small")
    (tmp_path / "big.md").write_text("zebra " * 100)
    monkeypatch.setattr(knowledge, "_MAX_FILE_BYTES", 50)
    index = FolderRetriever(tmp_path)._build()
    assert [p.source for p in index.passages] == ["small.md:1"]


@pytest.mark.parametrize(
    ("plural", "singular"),
    [
        # the cases of the review: "es" after a sibilant
        ("classes", "class"),
        ("addresses", "address"),
        ("indexes", "index"),
        ("statuses", "status"),
        # kept from before
        ("queries", "query"),
        ("refunds", "refund"),
        ("boxes", "box"),
        ("notes", "note"),
        ("releases", "release"),
        ("employees", "employee"),
        ("keys", "key"),
        # every rule, and singulars that end like a stem plus "e"
        ("processes", "process"),
        ("buzzes", "buzz"),
        ("matches", "match"),
        ("wishes", "wish"),
        ("fixes", "fix"),
        ("buses", "bus"),
        ("viruses", "virus"),
        ("uses", "use"),
        ("causes", "cause"),
        ("houses", "house"),
        ("caches", "cache"),
        ("axes", "axe"),
        ("movies", "movie"),
        ("ties", "tie"),
    ],
)
def test_a_plural_matches_its_singular(plural: str, singular: str) -> None:
    assert tokenize(plural) == tokenize(singular)
    assert tokenize(plural.capitalize()) == tokenize(singular)


@pytest.mark.parametrize("word", ["glass", "bus", "status", "gas", "less", "address", "campus"])
def test_words_that_only_look_plural_keep_their_form(word: str) -> None:
    assert tokenize(word) == [word]


def test_a_plural_query_finds_a_singular_passage() -> None:
    index = BM25Index(
        [
            Passage("Each class has an index and a status.", "a.md:1"),
            Passage("Send it to this address.", "b.md:1"),
            Passage("cats", "c"),
        ]
    )
    assert [p.source for p in index.search("classes indexes statuses", 3)] == ["a.md:1"]
    assert [p.source for p in index.search("addresses", 3)] == ["b.md:1"]
