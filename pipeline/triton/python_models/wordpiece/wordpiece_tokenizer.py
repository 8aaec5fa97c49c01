"""BERT-style WordPiece text preprocessing in plain Python: keras-hub 0.32's, token for token, without keras.

It reproduces the eager (pure Python) path of ``keras_hub.tokenizers.WordPieceTokenizer`` (and so of
``BertTokenizer`` / ``DistilBertTokenizer``) and the packing that ``BertTextClassifierPreprocessor`` /
``DistilBertTextClassifierPreprocessor`` add: ``[CLS] ids [SEP]``, cut to ``sequence_length``, padded.
It runs inside a Triton Python-backend stub, so it needs the standard library and numpy only and imports
nothing from ``pipeline``; ``pipeline/stages/tokenizer_export.py`` writes the two files it reads
(``tokenizer_settings.json`` and ``vocabulary.txt``) from a live keras-hub tokenizer.

keras-hub's steps, in its order (``keras_hub/src/tokenizers/word_piece_tokenizer.py``):

1. ``strip_accents``: NFD, then every ``Mn`` (non-spacing mark) character dropped;
2. ``split``: scanning left to right, a special token (only with ``special_tokens_in_strings``) is kept whole,
   whitespace (``[ \\t\\n\\r\\f]``, ``Cc``, ``Cf``) is dropped, punctuation (ASCII non-alphanumerics and ``P*``)
   and, with ``split_on_cjk``, CJK ideographs become one-character words; the runs between are words;
3. ``lowercase``: per word except special tokens, NFKC_Casefold (NFKC, casefold, NFKC, default ignorables
   dropped), after splitting, so a folded character never splits a word;
4. greedy longest-match-first WordPiece per word, continuation pieces prefixed with ``suffix_indicator``;
   a word of more than 100 UTF-8 bytes (after folding), or one that cannot be covered, is one ``oov_token``.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np

SETTINGS_FILENAME = "tokenizer_settings.json"
VOCABULARY_FILENAME = "vocabulary.txt"
OUTPUT_NAMES = ("token_ids", "padding_mask", "segment_ids")

_ASCII_WHITESPACE = frozenset(" \t\n\r\f")
# keras-hub's PY_CJK_REGEX (from google-research/bert's _is_chinese_char)
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
# keras_hub/src/utils/tensor_utils.py: the Default_Ignorable_Code_Point ranges its case folding drops
_DEFAULT_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
# keras-hub splits with the `regex` module, whose Unicode tables (17.0 in regex 2026) are newer than those of
# Python's unicodedata (14.0 in 3.11): these code points are punctuation (P*) / format (Cf) there, unassigned here
_LATER_PUNCTUATION = (
    (0x1B4E, 0x1B4F), (0x1B7F, 0x1B7F), (0x2E60, 0x2E63), (0x10D6E, 0x10D6E), (0x10ED0, 0x10ED0),
    (0x113D4, 0x113D5), (0x113D7, 0x113D8), (0x11B00, 0x11B09), (0x11BE1, 0x11BE1), (0x11F43, 0x11F4F),
    (0x16D6D, 0x16D6F), (0x1E5FF, 0x1E5FF),
)
_LATER_FORMAT = ((0x13439, 0x1343F),)
_DROP, _KEEP, _WORD = 0, 1, 2  # what splitting does with one character


def _char_kind(char: str, split_on_cjk: bool) -> int:
    """Whether ``char`` is dropped (whitespace/control), kept as its own word (punctuation, CJK) or part of a word."""
    if char in _ASCII_WHITESPACE:
        return _DROP
    code = ord(char)
    if 0x21 <= code <= 0x2F or 0x3A <= code <= 0x40 or 0x5B <= code <= 0x60 or 0x7B <= code <= 0x7E:
        return _KEEP
    category = unicodedata.category(char)
    if category in ("Cc", "Cf"):
        return _DROP
    if category[0] == "P":
        return _KEEP
    if category == "Cn":
        if any(lo <= code <= hi for lo, hi in _LATER_FORMAT):
            return _DROP
        if any(lo <= code <= hi for lo, hi in _LATER_PUNCTUATION):
            return _KEEP
    if split_on_cjk and any(lo <= code <= hi for lo, hi in _CJK_RANGES):
        return _KEEP
    return _WORD


def _is_default_ignorable(char: str) -> bool:
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in _DEFAULT_IGNORABLE_RANGES)


def casefold(text: str) -> str:
    """keras-hub's ``casefold_utf8``: NFKC, full case folding, NFKC again, default-ignorable code points dropped."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    if any(_is_default_ignorable(c) for c in text):
        text = "".join(c for c in text if not _is_default_ignorable(c))
    return text


class WordPiece:
    """One keras-hub WordPiece tokenizer, rebuilt from its settings and vocabulary (id = position in the list)."""

    def __init__(self, settings: Mapping, vocabulary: Sequence[str]) -> None:
        self.lowercase = bool(settings["lowercase"])
        self.strip_accents = bool(settings["strip_accents"])
        self.split = bool(settings["split"])
        self.split_on_cjk = bool(settings["split_on_cjk"])
        self.suffix_indicator = str(settings["suffix_indicator"])
        self.oov_token = str(settings["oov_token"])
        self.max_bytes_per_word = int(settings.get("max_bytes_per_word", 100))
        self.tokenizer_sequence_length = settings.get("tokenizer_sequence_length")
        # keras-hub tries the special tokens as regex alternatives in this order: the first that matches wins
        self.special_tokens = tuple(t for t in settings.get("special_tokens") or () if t) if self.split else ()
        self._special_set = frozenset(self.special_tokens)
        self._special_first_chars = frozenset(t[0] for t in self.special_tokens)
        # a repeated token maps to its last line, as keras-hub's {token: i for i, token in enumerate(vocabulary)}
        self.token_to_id = {token: i for i, token in enumerate(vocabulary)}
        self.vocabulary_size = len(vocabulary)
        if self.oov_token not in self.token_to_id:
            raise ValueError(f"the oov token {self.oov_token!r} is not in the vocabulary")
        self._oov_id = self.token_to_id[self.oov_token]
        # no vocabulary entry is longer than this, so longer candidate pieces need no lookup
        self._max_piece_chars = max((len(t) for t in vocabulary), default=0)
        self._kinds: dict[str, int] = {}

    def words(self, text: str) -> list[str]:
        """``text`` pre-tokenized as keras-hub's ``pretokenize_python`` does: accents, split, then lowercase."""
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        words = self._split(text) if self.split else [text]
        if self.lowercase:
            words = [w if w in self._special_set else casefold(w) for w in words]
        return words

    def _split(self, text: str) -> list[str]:
        words: list[str] = []
        kinds = self._kinds
        start = i = 0
        while i < len(text):
            char = text[i]
            if char in self._special_first_chars:
                special = next((t for t in self.special_tokens if text.startswith(t, i)), None)
                if special is not None:
                    if i > start:
                        words.append(text[start:i])
                    words.append(special)
                    i = start = i + len(special)
                    continue
            kind = kinds.get(char)
            if kind is None:
                kind = kinds[char] = _char_kind(char, self.split_on_cjk)
            if kind != _WORD:
                if i > start:
                    words.append(text[start:i])
                if kind == _KEEP:
                    words.append(char)
                start = i + 1
            i += 1
        if start < len(text):
            words.append(text[start:])
        return words

    def word_ids(self, word: str) -> list[int]:
        """Greedy longest-match-first WordPiece ids of one pre-tokenized word (``[oov]`` when it cannot be covered)."""
        if not word:
            return []
        if len(word.encode("utf-8")) > self.max_bytes_per_word:
            return [self._oov_id]
        ids = []
        start = 0
        while start < len(word):
            end = min(len(word), start + self._max_piece_chars)
            found = None
            while start < end:
                piece = word[start:end] if start == 0 else self.suffix_indicator + word[start:end]
                found = self.token_to_id.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [self._oov_id]
            ids.append(found)
            start = end
        return ids

    def ids(self, text: str) -> list[int]:
        """The token ids keras-hub's tokenizer gives for ``text`` (a single string)."""
        ids = [i for word in self.words(text) for i in self.word_ids(word)]
        if self.tokenizer_sequence_length:
            # a tokenizer built with sequence_length pads with 0 (not the pad token) and cuts, before any packing
            length = int(self.tokenizer_sequence_length)
            ids = ids[:length] + [0] * (length - len(ids))
        return ids


def padded_length(longest: int, buckets: Sequence[int], sequence_length: int) -> int:
    """The smallest bucket that holds ``longest`` tokens; ``sequence_length`` when none does."""
    return next((b for b in buckets if b >= longest), sequence_length)


def encode_batch(texts: Sequence[str], settings: Mapping, wordpiece: WordPiece) -> dict[str, np.ndarray]:
    """What keras-hub's ``(DistilBert|Bert)TextClassifierPreprocessor`` gives for ``texts``, padded to a bucket.

    Each row is ``start ids end``, its ids cut so the row fits ``settings["sequence_length"]`` (for one segment
    keras-hub's "round_robin" and "waterfall" both keep the first ``sequence_length - 2`` ids), right-padded
    with the pad token. ``padding_mask`` is ``token_ids != pad id``, as keras-hub computes it. Unlike
    keras-hub, rows are padded to the smallest of ``settings["buckets"]`` that holds the longest row (else
    ``sequence_length``), so with ``buckets == [sequence_length]`` the result is keras-hub's exactly.
    Returns the outputs named in ``settings["outputs"]``, int32 ``[len(texts), length]``, each under the model's
    own name for it where ``settings["input_names"]`` gives one (``input_ids`` for ``token_ids``, ...).
    """
    sequence_length = int(settings["sequence_length"])
    start, end, pad = (wordpiece.token_to_id[settings[k]] for k in ("start_token", "end_token", "pad_token"))
    keep = max(sequence_length - 2, 0)
    rows = [[start, *wordpiece.ids(text)[:keep], end] for text in texts]
    longest = max((len(r) for r in rows), default=0)
    length = padded_length(longest, settings.get("buckets") or (), sequence_length)
    token_ids = np.full((len(rows), length), pad, dtype=np.int32)
    for i, row in enumerate(rows):
        token_ids[i, : len(row)] = row
    arrays = {
        "token_ids": token_ids,
        "padding_mask": (token_ids != pad).astype(np.int32),
        "segment_ids": np.zeros_like(token_ids),
    }
    names = settings.get("input_names") or {}
    return {names.get(name, name): arrays[name] for name in settings["outputs"]}


def read_vocabulary(path: str) -> list[str]:
    """The tokens of a ``vocabulary.txt``: one per ``\\n``-ended line, nothing stripped (a token may hold ``\\r``)."""
    with open(path, encoding="utf-8", newline="") as file:
        text = file.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def load(directory: str) -> tuple[WordPiece, dict]:
    """The tokenizer and its settings from ``tokenizer_settings.json`` and ``vocabulary.txt`` in ``directory``.

    Raises ValueError when the files disagree (a vocabulary of another size, a special token missing from it).
    """
    with open(os.path.join(directory, SETTINGS_FILENAME), encoding="utf-8") as file:
        settings = json.load(file)
    vocabulary = read_vocabulary(os.path.join(directory, VOCABULARY_FILENAME))
    expected = settings.get("vocabulary_size")
    if expected is not None and expected != len(vocabulary):
        raise ValueError(f"{VOCABULARY_FILENAME} holds {len(vocabulary)} tokens, {SETTINGS_FILENAME} says {expected}")
    wordpiece = WordPiece(settings, vocabulary)
    for key in ("start_token", "end_token", "pad_token"):
        if settings[key] not in wordpiece.token_to_id:
            raise ValueError(f"the {key} {settings[key]!r} is not in {VOCABULARY_FILENAME}")
    unknown = [name for name in settings["outputs"] if name not in OUTPUT_NAMES]
    if unknown or not settings["outputs"]:
        raise ValueError(f"outputs must be among {', '.join(OUTPUT_NAMES)}; got {settings['outputs']}")
    return wordpiece, settings
