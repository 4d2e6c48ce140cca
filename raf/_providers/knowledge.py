"""KnowledgeProvider: passages for the last user message, from a folder (BM25) or a wiki."""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio
import anyio.to_thread
import attrs

from raf._onion.compose import ContextProvider
from raf._providers._paths import read_regular, require_dir_fd
from raf._sessions.base import Session
from raf._values.context import ContextResult
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.errors import ConfigError, PathError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["FolderRetriever", "KnowledgeProvider", "Passage", "Retriever", "WikiRetriever"]

TEXT_EXTENSIONS = (".md", ".markdown", ".txt", ".rst")
DEFAULT_CHUNK_CHARS = 1200
_MAX_FILE_BYTES = 5_000_000

_WORD = re.compile(r"\w+", re.UNICODE)
# Words too common to tell passages apart; kept short on purpose (English only).
_STOPWORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from")
    + ("has", "have", "how", "i", "in", "is", "it", "its", "of", "on", "or", "that", "the")
    + ("this", "to", "was", "what", "when", "where", "which", "who", "why", "will", "with")
    + ("you", "your")
)
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_LINK = re.compile(r"\[\[([^\[\]|#]+)(?:#[^\[\]|]*)?(?:\|[^\[\]]*)?\]\]")


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens without stopwords, a plural and its singular folded to one form.

    >>> tokenize("How do I reset the Routers?")
    ['reset', 'router']
    """
    return [_singular(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


# Plural endings after a sibilant, where English adds "es" to the singular
# (class-es, box-es, match-es, status-es), tried before Harman's general rules.
_SIBILANT_PLURALS: tuple[tuple[str, str], ...] = (
    ("sses", "ss"),
    ("zzes", "zz"),
    ("ches", "ch"),
    ("shes", "sh"),
    ("xes", "x"),
    ("uses", "us"),
)
# Singulars that end like one of those stems plus an "e" (cache, axe, cause,
# movie): "caches" cannot tell "cach" + "es" from "cache" + "s", so such a
# singular is folded the same way, and singular and plural meet.
_E_SINGULARS: tuple[tuple[str, str], ...] = (
    ("sse", "ss"),
    ("zze", "zz"),
    ("che", "ch"),
    ("she", "sh"),
    ("xe", "x"),
    ("use", "us"),
    ("ie", "y"),
)


def _singular(word: str) -> str:
    """One form for a word and its plural: Harman's S-stemmer, extended for "es" plurals.

    Harman (1991): "ies" -> "y" (not after "a" or "e"), "es" -> "e" (not
    "aes", "ees", "oes"), "s" -> "" (not "us", "ss"), for words of four
    letters or more; before them, the sibilant plurals above lose their
    "es"; after them, the singulars above are folded to the same stem.
    The result is a matching key, not always a word ("cache" -> "cach").
    """
    if len(word) >= 4:
        for ending, stem in _SIBILANT_PLURALS:
            if word.endswith(ending):
                return word[: -len(ending)] + stem
        if word.endswith("ies") and not word.endswith(("eies", "aies")):
            return word[:-3] + "y"
        # Harman's "es" -> "e" and "s" -> "" both drop the final "s"; between
        # them they spare only words in "us" and "ss" (bus, status, glass).
        if word.endswith("s") and not word.endswith(("us", "ss")):
            word = word[:-1]
    if len(word) >= 3:
        for ending, stem in _E_SINGULARS:
            if word.endswith(ending):
                return word[: -len(ending)] + stem
    return word


@attrs.frozen(slots=True)
class Passage:
    """A piece of text, where it comes from (``guide.md:12``), and its score for a query."""

    text: str
    source: str
    score: float = 0.0


@runtime_checkable
class Retriever(Protocol):
    """Finds the passages that best answer a query, best first."""

    async def retrieve(self, query: str, top_k: int) -> Sequence[Passage]: ...


def split_passages(text: str, source: str, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> list[Passage]:
    """Cut a document into passages of about ``chunk_chars``.

    Paragraphs (blank-line separated) are joined until the size is reached;
    a Markdown heading (``# `` to ``###### ``, outside code blocks) starts a
    new passage. Each passage's source is ``source:line`` of its first line.

    >>> [p.source for p in split_passages("# A\\ntext\\n\\n# B\\nmore", "doc.md")]
    ['doc.md:1', 'doc.md:4']
    """
    # Paragraphs as (first line number, lines, starts with a heading).
    paragraphs: list[tuple[int, list[str], bool]] = []
    lines: list[str] = []
    starts_with_heading = False
    fence: str | None = None  # the opening ``` or ~~~ while inside a fenced code block
    for number, line in enumerate(text.splitlines()):
        # A '#' line inside a code block is a comment, not a heading.
        heading = fence is None and _HEADING.match(line) is not None
        marker = _FENCE.match(line)
        if marker is not None and (fence is None or marker.group(1).startswith(fence)):
            fence = marker.group(1)[:3] if fence is None else None
        if (not line.strip() or heading) and lines:
            paragraphs.append((number - len(lines), lines, starts_with_heading))
            lines = []
        if line.strip():
            if not lines:
                starts_with_heading = heading
            lines.append(line)
        if lines and sum(len(x) + 1 for x in lines) > 2 * chunk_chars:
            paragraphs.append((number + 1 - len(lines), lines, starts_with_heading))
            lines = []  # a paragraph much longer than a passage is cut
    if lines:
        paragraphs.append((len(text.splitlines()) - len(lines), lines, starts_with_heading))

    passages: list[Passage] = []
    start, size = 0, 0
    current: list[str] = []
    for first, paragraph, heading in paragraphs:
        length = sum(len(x) + 1 for x in paragraph)
        if current and (heading or size + length > chunk_chars):
            passages.append(Passage("\n".join(current), f"{source}:{start + 1}"))
            current, size = [], 0
        if current:
            current.append("")
        else:
            start = first
        current.extend(paragraph)
        size += length
    if current:
        passages.append(Passage("\n".join(current), f"{source}:{start + 1}"))
    return passages


class BM25Index:
    """Okapi BM25 over passages (``k1=1.5``, ``b=0.75``), built once.

    >>> index = BM25Index([Passage("cats purr", "a"), Passage("dogs bark", "b")])
    >>> [p.source for p in index.search("why do dogs bark", 5)]
    ['b']
    """

    def __init__(self, passages: Iterable[Passage], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.passages = list(passages)
        self.k1 = k1
        self.b = b
        self._terms = [Counter(tokenize(p.text)) for p in self.passages]
        self._lengths = [sum(t.values()) for t in self._terms]
        self._average = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        frequency: Counter[str] = Counter()
        self._postings: dict[str, list[int]] = {}
        for index, terms in enumerate(self._terms):
            frequency.update(terms.keys())
            for term in terms:
                self._postings.setdefault(term, []).append(index)
        count = len(self.passages)
        self._idf = {
            term: math.log(1 + (count - df + 0.5) / (df + 0.5)) for term, df in frequency.items()
        }

    def scores(self, query: str) -> dict[int, float]:
        """Scores of the passages that share a term with ``query``, by passage index."""
        scores: dict[int, float] = {}
        k1, b, average = self.k1, self.b, self._average or 1.0
        for term in set(tokenize(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for index in self._postings[term]:
                tf = self._terms[index][term]
                norm = k1 * (1 - b + b * self._lengths[index] / average)
                scores[index] = scores.get(index, 0.0) + idf * tf * (k1 + 1) / (tf + norm)
        return scores

    def search(self, query: str, top_k: int) -> list[Passage]:
        """The ``top_k`` best passages with a positive score, best first."""
        return self.ranked(self.scores(query), top_k)

    def ranked(self, scores: dict[int, float], top_k: int) -> list[Passage]:
        """The ``top_k`` best of ``scores`` (from :meth:`scores`) as passages."""
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        return [attrs.evolve(self.passages[i], score=s) for i, s in ranked[:top_k] if s > 0]


def _text_files(root: Path, extensions: Sequence[str], limit: int) -> Iterator[tuple[str, str]]:
    """``(path beneath root, text)`` of each readable text file under ``root``, in order.

    The folders are walked from descriptors (``os.fwalk``), never through a
    symlink; only regular files with one link are read (see
    :func:`raf._providers._paths.read_regular`), at most ``limit`` bytes each.
    Hidden files and folders, symlinks, special files and files that are too
    big or not UTF-8 are skipped.
    """
    for directory, folders, names, folder_fd in os.fwalk(root, follow_symlinks=False):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        relative = Path(directory).relative_to(root)
        for name in sorted(names):
            if not name.lower().endswith(tuple(extensions)) or name.startswith("."):
                continue
            try:
                data = read_regular(folder_fd, name, max_bytes=limit, label=name, where="")
                text = data.decode("utf-8")
            except (PathError, UnicodeDecodeError):
                continue
            yield (relative / name).as_posix(), text


def _check_root(root: str | os.PathLike[str], what: str) -> Path:
    require_dir_fd(f"the {what} retriever")
    resolved = Path(root).resolve()
    if not resolved.is_dir():
        raise ConfigError(f"{what} root {str(root)!r} is not a directory")
    return resolved


class FolderRetriever:
    """BM25 over the text and Markdown files of a folder (and its subfolders).

    Files are split into passages (:func:`split_passages`); the index is
    built in a worker thread on the first query and kept; :meth:`refresh`
    rebuilds it. Files that are not UTF-8 or are over 5 MB are skipped.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        extensions: Sequence[str] = TEXT_EXTENSIONS,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
    ) -> None:
        self.root = _check_root(root, "knowledge")
        self.extensions = tuple(e.lower() for e in extensions)
        self.chunk_chars = chunk_chars
        self._index: BM25Index | None = None
        self._lock = anyio.Lock()

    def _build(self) -> BM25Index:
        passages: list[Passage] = []
        for source, text in _text_files(self.root, self.extensions, _MAX_FILE_BYTES):
            passages.extend(split_passages(text, source, self.chunk_chars))
        return BM25Index(passages)

    async def index(self) -> BM25Index:
        """The index, built on first use."""
        if self._index is None:
            async with self._lock:
                if self._index is None:
                    self._index = await anyio.to_thread.run_sync(
                        self._build, abandon_on_cancel=True
                    )
        return self._index

    async def refresh(self) -> None:
        """Read the folder again."""
        async with self._lock:
            self._index = await anyio.to_thread.run_sync(self._build, abandon_on_cancel=True)

    async def retrieve(self, query: str, top_k: int) -> list[Passage]:
        """The ``top_k`` best passages for ``query``."""
        return (await self.index()).search(query, top_k)


def _page_key(title: str) -> str:
    return re.sub(r"[\s_\-]+", " ", title.strip().lower())


@attrs.frozen(slots=True)
class _Wiki:
    index: BM25Index
    pages: dict[str, str]  # page key -> source (relative path)
    links: dict[str, tuple[str, ...]]  # source -> page keys it links to
    first: dict[str, list[int]]  # source -> indexes of its passages


class WikiRetriever:
    """BM25 over a folder of wiki pages, following ``[[links]]`` one hop.

    A page is a Markdown file; ``[[Page Name]]``, ``[[page-name|label]]``
    and ``[[Page#Section]]`` link to the page whose file name (without the
    extension) matches, ignoring case and treating spaces, ``-`` and ``_``
    alike. The best passages for the query come first; then, for each of
    them, the best passage (for the same query, else the first) of each
    page it links to, marked ``linked from ...``, up to ``top_k`` more.
    Links to missing pages are ignored.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        extensions: Sequence[str] = (".md", ".markdown"),
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
    ) -> None:
        self.root = _check_root(root, "wiki")
        self.extensions = tuple(e.lower() for e in extensions)
        self.chunk_chars = chunk_chars
        self._wiki: _Wiki | None = None
        self._lock = anyio.Lock()

    def _build(self) -> _Wiki:
        passages: list[Passage] = []
        pages: dict[str, str] = {}
        links: dict[str, tuple[str, ...]] = {}
        first: dict[str, list[int]] = {}
        for source, text in _text_files(self.root, self.extensions, _MAX_FILE_BYTES):
            pages.setdefault(_page_key(PurePosixPath(source).stem), source)
            links[source] = tuple(dict.fromkeys(_page_key(m) for m in _LINK.findall(text)))
            page_passages = split_passages(text, source, self.chunk_chars)
            first[source] = list(range(len(passages), len(passages) + len(page_passages)))
            passages.extend(page_passages)
        return _Wiki(BM25Index(passages), pages, links, first)

    async def refresh(self) -> None:
        """Read the pages again."""
        async with self._lock:
            self._wiki = await anyio.to_thread.run_sync(self._build, abandon_on_cancel=True)

    async def retrieve(self, query: str, top_k: int) -> list[Passage]:
        """The best passages, then one passage of each page they link to."""
        if self._wiki is None:
            async with self._lock:
                if self._wiki is None:
                    self._wiki = await anyio.to_thread.run_sync(self._build, abandon_on_cancel=True)
        wiki = self._wiki
        scores = wiki.index.scores(query)
        hits = wiki.index.ranked(scores, top_k)
        shown = {p.source for p in hits}
        seen_pages = {p.source.rsplit(":", 1)[0] for p in hits}
        linked: list[Passage] = []
        for hit in hits:
            page = hit.source.rsplit(":", 1)[0]
            for key in wiki.links.get(page, ()):
                target = wiki.pages.get(key)
                if target is None or target in seen_pages or len(linked) >= top_k:
                    continue
                seen_pages.add(target)
                candidates = wiki.first.get(target, [])
                if not candidates:
                    continue
                best = max(candidates, key=lambda i: (scores.get(i, 0.0), -i))
                passage = wiki.index.passages[best]
                if passage.source in shown:
                    continue
                shown.add(passage.source)
                linked.append(
                    attrs.evolve(
                        passage,
                        source=f"{passage.source} (linked from {page})",
                        score=scores.get(best, 0.0),
                    )
                )
        return hits + linked


class KnowledgeProvider(ContextProvider):
    """Inject the passages that best match the last user message, with their sources.

    ``retriever`` is any :class:`Retriever`; :meth:`folder` and :meth:`wiki`
    build one over a folder. The passages go into the instructions, each
    with its source so the model can cite it; nothing is injected when no
    passage matches. They change with every question, so the result is
    ``volatile`` (the tail, after the history: the cached prefix stays put);
    ``volatile=False`` puts them in the system message instead.
    """

    kind = "knowledge"

    def __init__(
        self,
        retriever: Retriever,
        *,
        top_k: int = 3,
        name: str | None = None,
        kind: str | None = None,
        volatile: bool = True,
    ) -> None:
        if not callable(getattr(retriever, "retrieve", None)):
            raise TypeError(f"retriever must have an async retrieve(query, top_k): {retriever!r}")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        if name is not None:
            self.name = name
        if kind is not None:
            self.kind = kind
        if not isinstance(volatile, bool):
            raise TypeError(f"volatile must be a bool, got {volatile!r}")
        self.retriever = retriever
        self.top_k = top_k
        self.volatile = volatile

    @classmethod
    def folder(
        cls,
        root: str | os.PathLike[str],
        *,
        top_k: int = 3,
        name: str | None = None,
        volatile: bool = True,
    ) -> KnowledgeProvider:
        """A knowledge provider over the text and Markdown files under ``root`` (BM25)."""
        return cls(FolderRetriever(root), top_k=top_k, name=name, volatile=volatile)

    @classmethod
    def wiki(
        cls,
        root: str | os.PathLike[str],
        *,
        top_k: int = 3,
        name: str | None = None,
        volatile: bool = True,
    ) -> KnowledgeProvider:
        """A provider of kind ``wiki`` over linked pages under ``root``."""
        return cls(WikiRetriever(root), top_k=top_k, name=name, kind="wiki", volatile=volatile)

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The top passages for the last user message, as (volatile) instructions."""
        query = next(
            (m.content for m in reversed(messages) if m.role == "user" and m.content), None
        )
        if query is None or not tokenize(query):
            return ContextResult()
        passages = await self.retriever.retrieve(query, self.top_k)
        if not passages:
            return ContextResult()
        blocks = "\n\n".join(
            f"[{number}] source: {p.source}\n{p.text}" for number, p in enumerate(passages, 1)
        )
        return ContextResult(
            instructions=(
                "Passages from the knowledge base that may help with the user's last message. "
                "Use them when they are relevant and cite their sources as [n]; say so when "
                f"they do not answer the question.\n\n{blocks}"
            ),
            volatile=self.volatile,
        )
