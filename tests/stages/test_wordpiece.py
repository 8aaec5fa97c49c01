"""The plain-Python WordPiece of the ``wordpiece`` Triton model against real keras-hub 0.32, token for token.

Tokenizers are built offline from small vocabularies written here; the settings come from
``pipeline.stages.tokenizer_export`` (so that module is checked too), the tokenizer and model from the
backend folder, imported by path as Triton's stub would (it is not a package).
"""

from __future__ import annotations

import importlib.util
import random
import sys
import types
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.stages.tokenizer_export import (BERT_OUTPUTS, DISTIL_BERT_OUTPUTS, wordpiece_settings,
                                              write_tokenizer_files)

FOLDER = Path(__file__).resolve().parents[2] / "pipeline" / "triton" / "python_models" / "wordpiece"

VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "The", "quick", "brown", "fox", "Fox", "jump", "##ed",
    "##s", "##ing", "cafe", "café", "naive", "na", "##ive", "##ïve", ".", ",", "'", "!", "?", "-", ":", "/", "[",
    "]", "<", ">", "#", "$", "`", "^", "~", "\\", "3", "14", "1", "##4", "http", "https", "www", "example",
    "com", "你", "好", "世", "界", "日", "本", "don", "t", "it", "hello", "Hello", "world", "a", "##a", "b", "##b",
    "un", "##aff", "##able", "fine", "ss", "stra", "##ss", "##e", "x", "cls", "sep", "mask", "😀", "«", "»", "—",
    "¿", "…", "e", "é", "abc", "ｈ", "h", "1st", "##st", "2", "##0", "##2", "i", "istanbul", "<x>", "@@",
    "the", "snow", "##man",  # "the" again: the last line wins, as in keras-hub
]

SENTENCES = [
    "The quick brown fox jumped.", "the QUICK Brown FOX jumps!", "don't", "It's Café naïve", "Cafe\u0301 nai\u0308ve",
    "你好世界", "日本 語", "hello😀world 😀", "tab\there\nnew\r\nline", "runs     of   spaces", "", "   ", "\t\n",
    "unaffable unknownword", "a" * 99, "a" * 100, "a" * 101, "é" * 50, "é" * 51, "3.14 and 1,000", "1st 2020 22",
    "https://www.example.com/the?fox=1#quick", "[CLS] hello [SEP]", "[cls] x[MASK]y [UNK] [PAD]", "Hello World",
    "«quick» — ¿fox?…", "ﬁne ﬁ", "STRASSE Straße", "İstanbul", "ＨＥＬＬＯ！ｈ", "zero\u200bwidth soft\u00adhyphen",
    "no\u00a0break \u3000ideo", "line\u2028sep", "ctl\x00\x07\x7f\x1cchars", "$^`~\\<x>", "snowman the",
    "bidi\u202ehello\u202c", "kor 안녕하세요 jp こんにちは", "\U00011f43split\u2e60here\U00013439",
    "e\u0301\u0301\u0301", "👍🏽👨‍👩‍👧", "Σίσυφος ΣΊΣΥΦΟΣ", "a" * 30 + " " + "the " * 40,
]


def _import(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, FOLDER / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kh() -> SimpleNamespace:
    """keras-hub (slow to import: once per module) and the backend's tokenizer module."""
    import keras_hub

    wp = _import("wordpiece_tokenizer")
    return SimpleNamespace(keras_hub=keras_hub, wp=wp)


def _tokenizers(keras_hub: ModuleType) -> dict[str, object]:
    t = keras_hub.tokenizers
    return {
        "bert_uncased": keras_hub.models.BertTokenizer(vocabulary=VOCAB, lowercase=True),
        "bert_uncased_strip": keras_hub.models.BertTokenizer(vocabulary=VOCAB, lowercase=True, strip_accents=True),
        "bert_cased": keras_hub.models.BertTokenizer(vocabulary=VOCAB, lowercase=False),
        "bert_specials": keras_hub.models.BertTokenizer(vocabulary=VOCAB, lowercase=True, special_tokens_in_strings=True),
        "distil": keras_hub.models.DistilBertTokenizer(vocabulary=VOCAB, lowercase=True, strip_accents=True),
        "plain_no_cjk": t.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True, split_on_cjk=False),
        "plain_extra_specials": t.WordPieceTokenizer(vocabulary=VOCAB, special_tokens=["<x>", "[CLS]"],
                                                     special_tokens_in_strings=True),
        "suffix_at": t.WordPieceTokenizer(vocabulary=[v.replace("##", "@@") for v in VOCAB], lowercase=True,
                                          suffix_indicator="@@", oov_token="[MASK]"),
        "fixed_length": t.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True, sequence_length=6),
    }


def _served(kh: SimpleNamespace, tokenizer: object, sequence_length: int = 16, buckets: list[int] | None = None,
            outputs: list[str] = BERT_OUTPUTS) -> tuple[object, dict]:
    settings, vocabulary = wordpiece_settings(tokenizer, sequence_length, buckets or [sequence_length], outputs)
    return kh.wp.WordPiece(settings, vocabulary), settings


def _fuzz_texts(count: int, seed: int = 7) -> list[str]:
    """Random strings over every kind of character the splitter tells apart, plus special tokens and words."""
    rng = random.Random(seed)
    pools = [
        [chr(c) for c in range(0x20, 0x7F)], list(" \t\n\r\f\v\x00\x1c\x85\u00a0\u2028\u3000"),
        [chr(c) for c in range(0xA0, 0x250)], [chr(c) for c in range(0x300, 0x370)],
        [chr(c) for c in range(0x4E00, 0x4E40)], [chr(c) for c in range(0xAC00, 0xAC20)],
        list("\u00ad\u200b\u200d\u2060\ufeff\ufe0f\u061c\U000e0041"), list("ﬁﬂ①ｈＡ！。、«»—…ß"),
        [chr(c) for c in (0x1B4E, 0x2E61, 0x10D6E, 0x11B03, 0x13439, 0x1343F, 0x1E5FF)],
        ["[CLS]", "[SEP]", "[MASK]", "<x>", "the", "fox", "##ing", "jumped", "café"],
    ]
    texts = []
    for _ in range(count):
        chars = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 30))]
        chars += [chr(rng.choice([rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])) for _ in range(rng.randint(0, 3))]
        rng.shuffle(chars)
        texts.append("".join(chars))
    return texts


def test_ids_equal_keras_hub_for_every_tokenizer_and_sentence(kh: SimpleNamespace) -> None:
    texts = SENTENCES + _fuzz_texts(400)
    for name, tokenizer in _tokenizers(kh.keras_hub).items():
        wordpiece, _ = _served(kh, tokenizer)
        expected = [np.asarray(row).tolist() for row in tokenizer(texts)]
        got = [wordpiece.ids(text) for text in texts]
        wrong = [(t, e, g) for t, e, g in zip(texts, expected, got) if e != g]
        assert not wrong, f"{name}: {len(wrong)} differ, first {wrong[0]!r}"


def test_pretokenized_words_equal_keras_hub(kh: SimpleNamespace) -> None:
    """The split itself (not only the ids it leads to): every word, for random text over all character kinds."""
    from keras_hub.src.tokenizers.word_piece_tokenizer import pretokenize_python

    texts = SENTENCES + _fuzz_texts(1500, seed=11)
    for name, tokenizer in _tokenizers(kh.keras_hub).items():
        wordpiece, settings = _served(kh, tokenizer)
        args = (settings["lowercase"], settings["strip_accents"], True, settings["split_on_cjk"],
                settings["special_tokens"] or None)
        wrong = [t for t in texts if wordpiece.words(t) != pretokenize_python(t, *args)]
        assert not wrong, f"{name}: {wrong[:3]!r}"


@pytest.mark.parametrize(("cls", "tokenizer_name", "outputs"), [
    ("BertTextClassifierPreprocessor", "bert_uncased", BERT_OUTPUTS),
    ("BertTextClassifierPreprocessor", "bert_specials", BERT_OUTPUTS),
    ("DistilBertTextClassifierPreprocessor", "distil", DISTIL_BERT_OUTPUTS),
])
def test_encode_batch_with_one_bucket_is_the_keras_hub_preprocessor(kh: SimpleNamespace, cls: str, tokenizer_name: str,
                                                                    outputs: list[str]) -> None:
    tokenizer = _tokenizers(kh.keras_hub)[tokenizer_name]
    batch = SENTENCES[:6] + ["the " * 30, "", "[PAD] the [PAD]"]  # one longer than S: truncated, [SEP] kept
    for length in (2, 3, 12, 40):
        preprocessor = getattr(kh.keras_hub.models, cls)(tokenizer, sequence_length=length)
        expected = {k: np.asarray(v) for k, v in preprocessor(batch).items()}
        wordpiece, settings = _served(kh, tokenizer, length, [length], outputs)
        got = kh.wp.encode_batch(batch, settings, wordpiece)
        assert list(got) == outputs and sorted(expected) == sorted(outputs)
        for key in outputs:
            assert got[key].dtype == np.int32 and got[key].shape == (len(batch), length)
            np.testing.assert_array_equal(got[key], expected[key].astype(np.int32), err_msg=f"{key} at S={length}")


def test_rows_pad_to_the_smallest_bucket_that_holds_the_longest(kh: SimpleNamespace) -> None:
    tokenizer = _tokenizers(kh.keras_hub)["bert_uncased"]
    wordpiece, settings = _served(kh, tokenizer, 16, [4, 8])
    full = {k: np.asarray(v) for k, v in kh.keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=16)(
        ["the fox", "the the the the the the", "the " * 20]).items()}
    for rows, length in ((["the fox", ""], 4), (["the fox", "the the the the the the"], 8),  # 2+2 ≤ 4; 6+2 = 8
                         (["the fox", "the " * 20], 16), ([], 4)):  # none holds 22: the sequence length
        got = kh.wp.encode_batch(rows, settings, wordpiece)
        assert got["token_ids"].shape == (len(rows), length)
    got = kh.wp.encode_batch(["the fox", "the the the the the the"], settings, wordpiece)
    for key in BERT_OUTPUTS:  # the bucketed rows are keras-hub's, cut where only padding follows
        np.testing.assert_array_equal(got[key], full[key][:2, :8].astype(np.int32))
        assert not full["padding_mask"][:2, 8:].any()
    assert kh.wp.padded_length(5, [4, 8, 12], 16) == 8 and kh.wp.padded_length(13, [4, 8, 12], 16) == 16


def test_files_round_trip_and_the_triton_model_serves_them(kh: SimpleNamespace, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = _tokenizers(kh.keras_hub)["distil"]
    settings, vocabulary = wordpiece_settings(tokenizer, 12, [8, 12], DISTIL_BERT_OUTPUTS)
    write_tokenizer_files(tmp_path, settings, vocabulary + ["odd\rtoken"])
    with pytest.raises(ValueError, match=f"holds {len(VOCAB) + 1} tokens"):
        kh.wp.load(str(tmp_path))
    write_tokenizer_files(tmp_path, settings, vocabulary)
    wordpiece, loaded = kh.wp.load(str(tmp_path))
    assert loaded == settings and wordpiece.ids("It's Café") == tokenizer("It's Café").tolist()

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name, self.array = name, array

        def as_numpy(self) -> np.ndarray:
            return self.array

    class Response:
        def __init__(self, output_tensors: list, error: object = None) -> None:
            self.outputs, self.error = {t.name: t.array for t in output_tensors}, error

    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor, fake.InferenceResponse, fake.TritonError = Tensor, Response, str  # type: ignore[attr-defined]
    fake.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    fake.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    model = _import("model").TritonPythonModel()
    config = ('{"name": "tok", "input": [{"name": "text", "data_type": "TYPE_STRING"}], '
              '"output": [{"name": "token_ids"}, {"name": "padding_mask"}]}')
    model.initialize({"model_config": config, "model_repository": str(tmp_path), "model_version": "1"})
    texts = [b"The quick brown fox.", "Café naïve 你好".encode()]
    good = {"text": Tensor("text", np.array(texts, dtype=object).reshape(2, 1))}
    bad = {"text": Tensor("text", np.array([[b"ok"], [b"\xff\xfe"]], dtype=object))}
    first, second, third = model.execute([good, bad, {}])
    expected = kh.keras_hub.models.DistilBertTextClassifierPreprocessor(tokenizer, sequence_length=12)(
        [t.decode() for t in texts])
    assert first.error is None and first.outputs["token_ids"].shape == (2, 8)
    np.testing.assert_array_equal(first.outputs["token_ids"], np.asarray(expected["token_ids"])[:, :8])
    np.testing.assert_array_equal(first.outputs["padding_mask"], np.asarray(expected["padding_mask"])[:, :8])
    assert "row 1 is not valid UTF-8" in second.error and "no input 'text'" in third.error
    config_extra = config.replace('{"name": "padding_mask"}', '{"name": "segment_ids"}')
    with pytest.raises(RuntimeError, match=r"outputs \['segment_ids'\] are not among"):
        model.initialize({"model_config": config_extra, "model_repository": str(tmp_path), "model_version": "1"})


def test_tokenizers_that_are_not_wordpiece_name_the_fix(kh: SimpleNamespace) -> None:
    bpe = kh.keras_hub.tokenizers.BytePairTokenizer(vocabulary={"a": 0, "b": 1, "ab": 2}, merges=["a b"])
    for tokenizer in (bpe, object()):
        with pytest.raises(PipelineError, match=r"--raw-inputs text supports WordPiece tokenizers \(BERT, DistilBERT\)"):
            wordpiece_settings(tokenizer, 16, [16], BERT_OUTPUTS)


def test_settings_the_served_model_cannot_honour_are_refused(kh: SimpleNamespace) -> None:
    tokenizer = _tokenizers(kh.keras_hub)["bert_uncased"]
    for length, buckets, outputs, match in ((1, [], BERT_OUTPUTS, "at least 2"), (16, [8, 4], BERT_OUTPUTS, "increasing"),
                                            (16, [32], BERT_OUTPUTS, "none above"), (16, [], ["ids"], "among")):
        with pytest.raises(PipelineError, match=match):
            wordpiece_settings(tokenizer, length, buckets, outputs)
    presplit = kh.keras_hub.models.BertTokenizer(vocabulary=VOCAB, split=False)
    with pytest.raises(PipelineError, match="split=False"):
        wordpiece_settings(presplit, 16, [], BERT_OUTPUTS)
