import pytest

from engine.text.detokenizer import IncrementalDetokenizer, find_stop, held_suffix_len
from engine.text.tokenizer import Tokenizer
from tests.engine.text.tokenizer_fixtures import write_bpe_dir, write_tekken_dir


class CharTok:
    """id = code point; 0 is a special token that decodes to <S> unless skipped."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if i == 0 and skip_special_tokens else "<S>" if i == 0 else chr(i)
                       for i in ids)


def _stream(detok, ids):
    pieces, stopped = [], False
    for i in ids:
        step = detok.push(i)
        pieces.append(step.new_text)
        if step.stopped:
            stopped = True
            break
    if not stopped:
        pieces.append(detok.flush())
    return pieces, stopped


@pytest.fixture(scope="module", params=["bpe", "tekken"])
def real_tok(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    return Tokenizer.from_dir(write_bpe_dir(d) if request.param == "bpe" else write_tekken_dir(d))


@pytest.mark.parametrize("text", ["ünïcödé 中文字符 🚀🌍 Paris", "  spaces\n\tand tabs ",
                                  "emoji 👩‍👩‍👧 ok"])
def test_stream_matches_full_decode_without_replacement_chars(real_tok, text):
    prompt = real_tok.encode("Question:", add_special_tokens=False)
    ids = real_tok.encode(text, add_special_tokens=False)
    if text.strip() != "spaces\n\tand tabs":  # really split into sub-character tokens
        assert any("\ufffd" in real_tok.decode([i]) for i in ids)
    pieces, stopped = _stream(IncrementalDetokenizer(real_tok, prompt), ids)
    assert not stopped
    assert "".join(pieces) == real_tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_multibyte_char_split_across_tokens_is_held(real_tok):
    ids = real_tok.encode("🚀", add_special_tokens=False)
    assert len(ids) >= 2  # byte tokens
    detok = IncrementalDetokenizer(real_tok, [])
    assert [detok.push(i).new_text for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1]).new_text == "🚀"


def test_flush_releases_incomplete_tail(real_tok):
    ids = real_tok.encode("a🚀", add_special_tokens=False)
    detok = IncrementalDetokenizer(real_tok, [])
    out = "".join(detok.push(i).new_text for i in ids[:-1])
    assert out == "a"
    assert detok.flush() == "\ufffd" * len(real_tok.decode(ids[:-1])[1:])


def _ids(s):
    return [ord(c) for c in s]


def test_stop_string_never_emitted_halfway():
    detok = IncrementalDetokenizer(CharTok(), [], stop=("STOP",))
    pieces, stopped = _stream(detok, _ids("abc STxSTOP and more"))
    assert stopped and detok.stop_str == "STOP"
    assert "".join(pieces) == "abc STx" == detok.text
    assert pieces[4:6] == ["", ""]  # "S", "T" held back until "x" rules out "STOP"
    assert pieces[6] == "STx"
    assert all("STO" not in p for p in pieces)
    assert detok.push(ord("z")).new_text == "" and detok.flush() == ""


def test_stop_strings_end_nothing_within_min_tokens():
    """vLLM's: a stop string matches only where it ends in the text of a token past the
    first min_tokens (one may start before)."""
    for stops in ((".", "ab"), (".", "abc")):  # the longest stop does not widen the search
        detok = IncrementalDetokenizer(CharTok(), [], stop=stops, min_tokens=3)
        pieces, stopped = _stream(detok, _ids("x.a.b"))
        assert stopped and "".join(pieces) == "x.a" and detok.stop_str == "."
    detok = IncrementalDetokenizer(CharTok(), [], stop=("ab",), min_tokens=2)
    pieces, stopped = _stream(detok, _ids("abab"))  # "ab" ends in token 2: not yet
    assert stopped and "".join(pieces) == "ab"
    detok = IncrementalDetokenizer(CharTok(), [], stop=("ab",), min_tokens=1)
    pieces, stopped = _stream(detok, _ids("abab"))  # starts in token 1, ends in 2
    assert stopped and "".join(pieces) == ""


def test_include_stop_str_and_earliest_match():
    detok = IncrementalDetokenizer(CharTok(), [], stop=("cd", "bcx"),
                                   include_stop_str_in_output=True)
    pieces, stopped = _stream(detok, _ids("abcdx"))
    assert stopped and "".join(pieces) == "abcd" and detok.stop_str == "cd"
    assert find_stop("xxabcab", ("ab", "cab"), 0) == (2, "ab")
    assert find_stop("xxabcab", ("ab", "cab"), 3) == (2, "ab")  # ends after index 3
    assert find_stop("xxabcab", ("ab", "cab"), 4) == (4, "cab")


def test_stop_string_spanning_tokens_and_multichar_tokens():
    class WordTok:
        vocab = ["Hello", " wor", "ld", "###", " end", "#"]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(self.vocab[i] for i in ids)

    detok = IncrementalDetokenizer(WordTok(), [], stop=("world#",))
    steps = [detok.push(i) for i in (0, 1, 2, 5)]
    assert [s.new_text for s in steps] == ["Hello", " ", "", ""]  # "wor" held
    assert steps[-1].stopped and detok.text == "Hello "
    detok = IncrementalDetokenizer(WordTok(), [], stop=("world#",))
    pieces, stopped = _stream(detok, [0, 1, 2, 4, 3])
    assert not stopped and "".join(pieces) == "Hello world end###"


def test_held_text_released_on_flush_and_stop_in_prompt_ignored():
    detok = IncrementalDetokenizer(CharTok(), _ids("ST"), stop=("STOP",))
    assert detok.push(ord("O")).new_text == "O"  # prompt text never matches
    step = detok.push(ord("P"))
    assert step.new_text == "P" and not step.stopped
    assert detok.push(ord("S")).new_text == ""
    assert detok.flush() == "S"
    assert held_suffix_len("xxSTO", ("STOP", "TOX")) == 3
    assert held_suffix_len("abc", ("STOP",)) == 0


def test_skip_special_tokens_option():
    assert "".join(_stream(IncrementalDetokenizer(CharTok(), [], (), True), [0, 97])[0]) == "a"
    detok = IncrementalDetokenizer(CharTok(), [], (), skip_special_tokens=False)
    assert "".join(_stream(detok, [0, 97])[0]) == "<S>a"


def test_sentencepiece_style_leading_space_uses_prompt_context():
    class SpTok:  # strips the leading space of the first decoded token, like Metaspace
        vocab = ["▁Hello", "▁world", "!"]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(self.vocab[i] for i in ids).replace("▁", " ").removeprefix(" ")

    detok = IncrementalDetokenizer(SpTok(), [0], ())
    assert detok.push(1).new_text == " world"
    assert detok.push(2).new_text == "!"


def test_kept_special_tokens_are_joined_without_added_spaces(real_tok):
    """skip_special_tokens false keeps special tokens as the tokenizer decodes them, no
    space added between them or around them (vLLM's spaces_between_special_tokens false;
    service/unsupported.py accepts both values for this reason)."""
    specials = sorted(real_tok.backend.special_ids)[:2]
    word = real_tok.encode("Paris", add_special_tokens=False)
    ids = [specials[0], specials[1], *word, specials[0]]
    names = [real_tok.id_to_token(i) for i in specials]
    want = names[0] + names[1] + "Paris" + names[0]
    assert real_tok.decode(ids, skip_special_tokens=False) == want
    detok = IncrementalDetokenizer(real_tok, [], (), skip_special_tokens=False)
    assert "".join(_stream(detok, ids)[0]) == want
