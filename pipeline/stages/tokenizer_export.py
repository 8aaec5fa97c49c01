"""A keras-hub WordPiece tokenizer as the two files the served ``wordpiece`` Triton model reads.

``pipeline/triton/python_models/wordpiece/wordpiece_tokenizer.py`` re-implements keras-hub's BERT text
preprocessing in plain Python for Triton's Python stub; this module reads the settings it needs off a live
``WordPieceTokenizer`` / ``BertTokenizer`` / ``DistilBertTokenizer`` (keras-hub is imported only here, lazily)
and writes ``tokenizer_settings.json`` and ``vocabulary.txt`` (one token per ``\\n``-ended line).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, require

# The same names as in pipeline/triton/python_models/wordpiece/wordpiece_tokenizer.py, which cannot be imported
# from here (it is not part of the package: it runs in Triton's stub).
SETTINGS_FILENAME = "tokenizer_settings.json"
VOCABULARY_FILENAME = "vocabulary.txt"
OUTPUT_NAMES = ("token_ids", "padding_mask", "segment_ids")
BERT_OUTPUTS = ["token_ids", "padding_mask", "segment_ids"]
DISTIL_BERT_OUTPUTS = ["token_ids", "padding_mask"]  # DistilBertTextClassifierPreprocessor drops segment_ids
NOT_WORDPIECE_FIX = ("--raw-inputs text supports WordPiece tokenizers (BERT, DistilBERT); for this model leave "
                     "--raw-inputs out and send token ids")


def _max_bytes_per_word() -> int:
    try:
        from keras_hub.src.tokenizers.word_piece_tokenizer import MAX_BYTES_PER_WORD
    except ImportError:  # a keras-hub that moved it: 100 is what tf-text's FastWordpieceTokenizer and 0.32 use
        return 100
    return int(MAX_BYTES_PER_WORD)


def _check_lengths(sequence_length: int, buckets: Sequence[int], outputs: Sequence[str]) -> None:
    require(isinstance(sequence_length, int) and sequence_length >= 2,
            f"sequence length {sequence_length!r} cannot hold [CLS] and [SEP]", "use a sequence length of at least 2")
    require(all(isinstance(b, int) for b in buckets) and list(buckets) == sorted(set(buckets))
            and all(2 <= b <= sequence_length for b in buckets),
            f"buckets {list(buckets)} must be distinct increasing lengths from 2 to {sequence_length}",
            f"list the padded lengths in increasing order, none above the sequence length {sequence_length}")
    require(bool(outputs) and len(set(outputs)) == len(outputs) and set(outputs) <= set(OUTPUT_NAMES),
            f"tokenizer outputs {list(outputs)} must be distinct names among {', '.join(OUTPUT_NAMES)}",
            "name the model's inputs the tokenizer feeds (token_ids, padding_mask, segment_ids)")


def _special_tokens_for_splitting(tokenizer: Any) -> list[str]:
    # keras-hub's WordPieceTokenizer._special_tokens_for_splitting, in its order (the regex tries them in turn)
    if not (tokenizer.split and getattr(tokenizer, "special_tokens_in_strings", False)):
        return []
    extra = tokenizer.get_config().get("special_tokens") or []
    return [str(t) for t in [*tokenizer.special_tokens, *extra]]


def wordpiece_settings(tokenizer: Any, sequence_length: int, buckets: list[int],
                       outputs: list[str]) -> tuple[dict, list[str]]:
    """The settings and vocabulary that make the served ``WordPiece`` tokenize and pack as ``tokenizer`` does.

    ``tokenizer`` is a keras-hub ``WordPieceTokenizer`` (``BertTokenizer``, ``DistilBertTokenizer``, ...);
    ``sequence_length`` is the preprocessor's, ``buckets`` the increasing padded lengths (``[]`` or
    ``[sequence_length]``: always ``sequence_length``), ``outputs`` the tensors to produce
    (:data:`BERT_OUTPUTS` or :data:`DISTIL_BERT_OUTPUTS`). Raises :class:`PipelineError` for a tokenizer
    that is not WordPiece, or one whose text preprocessing the served model cannot reproduce.
    """
    import keras_hub

    kind = type(tokenizer).__name__
    if not isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        raise PipelineError(f"raw text inputs: the model's tokenizer {kind} is not a WordPiece tokenizer",
                            NOT_WORDPIECE_FIX)
    _check_lengths(sequence_length, buckets, outputs)
    try:
        vocabulary = [str(t) for t in tokenizer.get_vocabulary()]
    except ValueError:
        raise PipelineError(f"raw text inputs: the {kind} has no vocabulary",
                            "build the tokenizer with its vocabulary (or load its preset) before exporting") from None
    dtype = str(getattr(tokenizer, "compute_dtype", "int32"))
    require("int" in dtype, f"raw text inputs: the {kind} gives {dtype} tokens, not ids",
            "build the tokenizer with an integer dtype (the default int32)")
    require(bool(tokenizer.split), f"raw text inputs: the {kind} has split=False, so it expects pre-split words",
            "build the tokenizer with split=True (the default) to serve raw text")
    bad = next((t for t in vocabulary if "\n" in t), None)
    require(bad is None, f"raw text inputs: the vocabulary token {bad!r} holds a newline, "
            f"which {VOCABULARY_FILENAME} (one token per line) cannot store", "remove the newline from that token")
    # a plain WordPieceTokenizer names no start/end/pad tokens: BERT's are the ones it would be packed with
    names = {key: getattr(tokenizer, key, None) or default
             for key, default in (("start_token", "[CLS]"), ("end_token", "[SEP]"), ("pad_token", "[PAD]"))}
    missing = [f"{key} {token!r}" for key, token in names.items() if token not in vocabulary]
    require(not missing, f"raw text inputs: the {kind}'s vocabulary lacks the {', '.join(missing)}",
            "use a BERT-style vocabulary that holds [CLS], [SEP] and [PAD]")
    settings = {
        "kind": "wordpiece",
        "lowercase": bool(tokenizer.lowercase),
        "strip_accents": bool(tokenizer.strip_accents),
        "split": bool(tokenizer.split),
        "split_on_cjk": bool(tokenizer.split_on_cjk),
        "suffix_indicator": str(tokenizer.suffix_indicator),
        "oov_token": str(tokenizer.oov_token),
        "special_tokens": _special_tokens_for_splitting(tokenizer),
        "max_bytes_per_word": _max_bytes_per_word(),
        "tokenizer_sequence_length": int(tokenizer.sequence_length) if tokenizer.sequence_length else None,
        **{key: str(token) for key, token in names.items()},
        "sequence_length": sequence_length,
        "buckets": list(buckets),
        "outputs": list(outputs),
        "vocabulary_size": len(vocabulary),
    }
    return settings, vocabulary


def write_tokenizer_files(directory: Path, settings: dict, vocabulary: Sequence[str]) -> list[Path]:
    """Write ``tokenizer_settings.json`` and ``vocabulary.txt`` into ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    settings_path, vocabulary_path = directory / SETTINGS_FILENAME, directory / VOCABULARY_FILENAME
    settings_path.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    # newline="": written as is, so a token holding "\r" reads back unchanged
    with open(vocabulary_path, "w", encoding="utf-8", newline="") as file:
        file.writelines(f"{token}\n" for token in vocabulary)
    return [settings_path, vocabulary_path]


TOKENIZER_DIR = "assets.extra/pipeline_tokenizer"  # inside the SavedModel: the Keras model's own tokenizer, when it has one
REFUSAL_FILE = "refused.txt"  # instead of the files: why this model's tokenizer cannot be served (one line)


def export_model_tokenizer(model: Any, saved: Path, inputs: Sequence[str]) -> None:
    """Beside a SavedModel, the tokenizer of a keras-hub task that carries its preprocessor (``model.preprocessor``
    with a ``tokenizer`` and a ``sequence_length``): :func:`write_tokenizer_files` with buckets ``[sequence_length]``,
    or a one-line refusal when it cannot be served (not WordPiece; inputs it does not make). Nothing for other models."""
    preprocessor = getattr(model, "preprocessor", None)
    tokenizer = getattr(preprocessor, "tokenizer", None)
    length = getattr(preprocessor, "sequence_length", None)
    if tokenizer is None or not length:
        return
    folder = Path(saved) / TOKENIZER_DIR
    unknown = [name for name in inputs if name not in OUTPUT_NAMES]
    try:
        require(not unknown, f"raw text inputs: the model takes {unknown}, which a WordPiece preprocessor does not make",
                "leave --raw-inputs out for this model")
        settings, vocabulary = wordpiece_settings(tokenizer, int(length), [int(length)], [n for n in OUTPUT_NAMES if n in inputs])
    except PipelineError as exc:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / REFUSAL_FILE).write_text(f"{exc.problem}\t{exc.fix or ''}\n")
        return
    write_tokenizer_files(folder, settings, vocabulary)


def read_model_tokenizer(saved: Path) -> Path:
    """The folder of the tokenizer files the savedmodel stage wrote; PipelineError (one line) when the model carries
    none, or one that cannot be served."""
    folder = Path(saved) / TOKENIZER_DIR
    if (folder / REFUSAL_FILE).is_file():
        problem, _, fix = (folder / REFUSAL_FILE).read_text().strip().partition("\t")
        raise PipelineError(problem, fix or None)
    require((folder / SETTINGS_FILENAME).is_file(), "--raw-inputs text needs the model's tokenizer, and this model carries none "
            "(a keras-hub task with its preprocessor, e.g. BertTextClassifier, carries one)",
            "save the task with its preprocessor (model.preprocessor = keras_hub.models.BertTextClassifierPreprocessor(...))")
    return folder


# Token inputs as other exporters name them (Hugging Face, TF Hub's BERT), and what the served tokenizer makes for each.
INPUT_ALIASES = {"input_ids": "token_ids", "input_word_ids": "token_ids", "attention_mask": "padding_mask",
                 "input_mask": "padding_mask", "token_type_ids": "segment_ids", "input_type_ids": "segment_ids"}
GIVEN_FIX = ("pass a keras-hub preset folder (config.json and tokenizer.json, as keras-hub saves and downloads them) "
             "or a WordPiece vocabulary file (vocab.txt, one token per line)")


def tokenizer_from_path(path: Path) -> Any:
    """The keras-hub tokenizer at ``path``: a preset folder (``keras_hub.tokenizers.Tokenizer.from_preset``), or a
    WordPiece vocabulary file (one token per line; lowercased and accents stripped when the vocabulary holds no capital
    letter outside its ``[...]`` special tokens, as BERT's uncased vocabularies). PipelineError (one line) otherwise."""
    import keras_hub

    path = Path(path)
    if path.is_dir():
        try:
            return keras_hub.tokenizers.Tokenizer.from_preset(str(path))
        except (ValueError, OSError, KeyError) as exc:
            raise PipelineError(f"--tokenizer {path}: keras-hub cannot load a tokenizer from it ({str(exc).splitlines()[0]})", GIVEN_FIX) from None
    try:
        vocabulary = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"--tokenizer {path}: cannot read it as a vocabulary ({exc})", GIVEN_FIX) from None
    vocabulary = [token.removesuffix("\r") for token in vocabulary]  # a vocab.txt written on Windows: CRLF line ends
    vocabulary = vocabulary[:-1] if vocabulary and vocabulary[-1] == "" else vocabulary
    require(len(vocabulary) >= 5, f"--tokenizer {path} holds {len(vocabulary)} lines, not a WordPiece vocabulary", GIVEN_FIX)
    cased = any(c.isupper() for token in vocabulary if not (token.startswith("[") and token.endswith("]")) for c in token)
    try:
        # uncased BERT vocabularies were made lowercased and with accents stripped (BERT's basic tokenizer does both)
        return keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=not cased, strip_accents=not cased)
    except ValueError as exc:  # keras-hub's own check: its out-of-vocabulary token [UNK] missing, and so on
        raise PipelineError(f"--tokenizer {path} is not a WordPiece vocabulary keras-hub takes ({str(exc).splitlines()[0]})", GIVEN_FIX) from None


def given_tokenizer_files(path: Path, dst: Path, tokens: Path, *, texts: list[str], inputs: list[str], dtypes: list[str],
                          sequence_length: int) -> Path:
    """For ``--tokenizer PATH`` (a model whose inputs are token ids and a mask, without a keras-hub preprocessor): the
    served tokenizer's files in ``dst`` (:func:`write_tokenizer_files`, the model's input names kept), and in
    ``tokens`` (``.npz``) what keras-hub makes of ``texts`` with that tokenizer, packed as keras-hub's BERT
    preprocessors pack (``MultiSegmentPacker``: ``[CLS] … [SEP]``, padded to ``sequence_length``): the gate's
    reference. In a child process (keras-hub and TensorFlow leave with it)."""
    from pipeline.core.isolate import call_in_child

    return call_in_child(_given_tokenizer_files, Path(path), Path(dst), Path(tokens), texts, inputs, dtypes, sequence_length)


def _given_tokenizer_files(path: Path, dst: Path, tokens: Path, texts: list[str], inputs: list[str], dtypes: list[str],
                           sequence_length: int) -> Path:
    import io

    import keras_hub
    import numpy as np

    from pipeline.core.atomic import write_bytes_atomic

    canonical = {name: INPUT_ALIASES.get(name, name) for name in inputs}
    unknown = [name for name, made in canonical.items() if made not in OUTPUT_NAMES]
    require(not unknown and len(set(canonical.values())) == len(canonical),
            f"--tokenizer: the model takes {inputs}, and a WordPiece tokenizer makes token ids, a padding mask and segment ids",
            f"name the model's inputs among {', '.join(OUTPUT_NAMES)} (or input_ids, attention_mask, token_type_ids)")
    require("token_ids" in canonical.values(), f"--tokenizer: none of the model's inputs {inputs} takes token ids",
            "name the ids input token_ids (or input_ids)")
    tokenizer = tokenizer_from_path(path)
    settings, vocabulary = wordpiece_settings(tokenizer, sequence_length, [sequence_length], [canonical[n] for n in inputs])
    settings["input_names"] = {made: name for name, made in canonical.items()}
    write_tokenizer_files(dst, settings, vocabulary)
    ids = {key: vocabulary.index(settings[key]) for key in ("start_token", "end_token", "pad_token")}
    if texts:
        packer = keras_hub.layers.MultiSegmentPacker(sequence_length=sequence_length, start_value=ids["start_token"],
                                                     end_value=ids["end_token"], pad_value=ids["pad_token"])
        token_ids, segment_ids = (np.asarray(a) for a in packer((tokenizer(texts),)))
    else:
        token_ids = segment_ids = np.zeros((0, sequence_length), np.int32)
    made = {"token_ids": token_ids, "padding_mask": token_ids != ids["pad_token"], "segment_ids": segment_ids}
    buffer = io.BytesIO()
    np.savez(buffer, **{name: made[canonical[name]].astype(dtype) for name, dtype in zip(inputs, dtypes, strict=True)})
    write_bytes_atomic(tokens, buffer.getvalue())
    return dst
