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
