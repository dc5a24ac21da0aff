"""Secrets masked in a job's output before it is stored: whole values, values split across entries and
polls (held back until the stream goes on), one stream not mixed with the other, short values left."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.domain.log_masking import MASK, LogMasker

SECRET = "hunter2-very-secret"


def _stream(masker: LogMasker, chunks: list[bytes], source: int = 0) -> bytes:
    out = b""
    for n, c in enumerate(chunks):
        out += b"".join(m for _, _, m in masker.feed([(float(n), source, c)]))
    return out + b"".join(m for _, _, m in masker.flush())


def test_whole_values_are_masked_and_short_ones_left() -> None:
    m = LogMasker([SECRET, "abc", "pass"])
    assert _stream(m, [f"token={SECRET}\n".encode(), b"abc pass\n"]) == b"token=******\nabc ******\n"


def test_a_value_split_across_entries_is_masked_and_never_stored_in_pieces() -> None:
    m = LogMasker([SECRET])
    first = m.feed([(1.0, 0, b"token=hunter2-")])
    assert first == [(1.0, 0, b"token=")]  # the possible start of the secret is held back
    assert m.feed([(2.0, 1, b"an error line\n")]) == [(2.0, 1, b"an error line\n")]  # stderr is its own stream
    assert m.feed([(3.0, 0, b"very-secret done\n")]) == [(1.0, 0, MASK + b" done\n")]
    assert m.flush() == []


def test_what_only_looked_like_a_start_is_released() -> None:
    m = LogMasker([SECRET])
    assert m.feed([(1.0, 0, b"hunter")]) == []
    assert m.feed([(2.0, 0, b"s and gatherers\n")]) == [(1.0, 0, b"hunters and gatherers\n")]
    assert m.feed([(3.0, 0, b"the end: hunt")]) == [(3.0, 0, b"the end: ")]
    assert m.flush() == [(3.0, 0, b"hunt")]


def test_no_secrets_is_a_pass_through() -> None:
    m = LogMasker([])
    entries = [(1.0, 0, b"x")]
    assert not m.active and m.feed(entries) == entries and m.flush() == []


@given(st.lists(st.binary(max_size=30), max_size=8), st.integers(0, 40), st.data())
def test_any_chunking_of_any_output_masks_every_occurrence(parts: list[bytes], _n: int, data: st.DataObject) -> None:
    secret = SECRET.encode()
    text = secret.join(parts) if len(parts) > 1 else b"x" + secret + b"y"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    out = _stream(LogMasker([SECRET]), [c for c in chunks if c])
    assert secret not in out
    assert out == text.replace(secret, MASK)


@given(st.data())
def test_two_streams_in_any_replies_keep_their_order_and_mask_every_value(data: st.DataObject) -> None:
    secrets = [SECRET, "other-token-42"]
    words = st.sampled_from([SECRET.encode(), b"other-token-42", b"hunter2-", b"other-", b"x", b"\n", b"very-secret"])
    streams = {src: b"".join(data.draw(st.lists(words, max_size=12))) for src in (0, 1)}
    pieces: list[tuple[int, bytes]] = []
    for src, text in streams.items():
        cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
        pieces += [(src, text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if text[a:b]]
    # interleave the two, each in its own order
    per_src = {0: [p for p in pieces if p[0] == 0], 1: [p for p in pieces if p[0] == 1]}
    mixed = []
    while per_src[0] or per_src[1]:
        src = data.draw(st.sampled_from([s for s in (0, 1) if per_src[s]]))
        mixed.append(per_src[src].pop(0))
    m = LogMasker(secrets)
    got: dict[int, bytes] = {0: b"", 1: b""}
    replies = data.draw(st.integers(1, 4))
    size = max(1, len(mixed) // replies)
    for k in range(0, len(mixed), size):
        for _, src, msg in m.feed([(float(k), s, piece) for s, piece in mixed[k : k + size]]):
            got[src] += msg
    for _, src, msg in m.flush():
        got[src] += msg
    for src, text in streams.items():
        assert got[src] == m.mask(text)
        assert SECRET.encode() not in got[src] and b"other-token-42" not in got[src]


def test_a_value_overlapping_a_longer_one_already_masked_is_not_masked_twice() -> None:
    m = LogMasker(["abcdefgh", "efghij"])
    assert m.mask(b"x abcdefghij y efghij") == b"x " + MASK + b"ij y " + MASK


def test_an_empty_entry_beside_a_masked_one_is_not_stored() -> None:
    m = LogMasker([SECRET])
    out = m.feed([(1.0, 0, f"a {SECRET}".encode()), (2.0, 0, b""), (3.0, 0, b" b\n")])
    assert out == [(1.0, 0, b"a " + MASK), (3.0, 0, b" b\n")]


def test_entries_of_both_streams_in_one_reply_are_masked_apart_and_kept_in_order() -> None:
    m = LogMasker([SECRET])
    out = m.feed([(1.0, 0, b"out hunter2-"), (2.0, 1, f"err {SECRET}\n".encode()), (3.0, 0, b"very-secret\n")])
    assert out == [(1.0, 0, b"out " + MASK + b"\n"), (2.0, 1, b"err " + MASK + b"\n")]
