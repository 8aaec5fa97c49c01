"""``build --raw-inputs text --tokenizer PATH``: a model whose inputs are token ids and a mask, without a keras-hub
preprocessor of its own, answering raw sentences through its tokenizer given apart (a vocab.txt, or a keras-hub
preset folder). Real TF, keras-hub, ONNX Runtime and tritonserver."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.build.config import BuildConfig
from pipeline.build.orchestrator import build
from pipeline.core.errors import PipelineError
from pipeline.triton.server import TritonServer


def _vocab(path: Path, tokens: list[str]) -> Path:
    path.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    return path


@pytest.mark.slow
def test_token_ids_model_answers_sentences_through_a_given_vocabulary(tmp_path: Path) -> None:
    import keras_hub
    import onnxruntime as ort
    import tritonclient.http as http

    from tests.zoo.hub import TEXT_CLASSES, TEXT_SEQUENCE_LENGTH, TEXT_VOCABULARY, sentences, write_sentences

    vocab = _vocab(tmp_path / "vocab.txt", TEXT_VOCABULARY)
    csv_path = write_sentences(tmp_path / "sentences.csv", n=300)
    result = build(BuildConfig(model="tests.zoo.hub:token_ids_classifier", name="ids_text", workdir=tmp_path / "build",
                               calibration_root=tmp_path / "calibration", repository=tmp_path / "repo", raw_inputs="text",
                               tokenizer=vocab, eval_data=csv_path))
    gate = json.loads(result.manifest.read_text())["results"]["raw_inputs"]
    assert gate["files"] == 300 and not gate["failures"] and gate["summary"]["probs"]["agreement"] == 1.0
    assert gate["summary"]["probs"]["accuracy"] > 0.8
    settings = json.loads((tmp_path / "repo" / "ids_text_tokenize" / "tokenizer_settings.json").read_text())
    # lowercase read off the vocabulary (no capitals outside [..]); the model's own input names kept
    assert settings["lowercase"] and settings["input_names"] == {"token_ids": "input_ids", "padding_mask": "attention_mask"}
    assert settings["buckets"] == [TEXT_SEQUENCE_LENGTH]  # the model's inputs have a fixed length

    texts, _ = sentences(np.random.default_rng(4), 6)
    texts[0] = "KALO, lomi!!  Kalos? xyzzy"
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "serve") as server:
        client = http.InferenceServerClient(server.http_url)
        tensor = http.InferInput("text", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        served = client.infer("ids_text", [tensor]).as_numpy("probs")
    # keras-hub's tokenizer on the same vocabulary, packed as BERT's, into the published FP32 model
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=TEXT_VOCABULARY, lowercase=True)
    packed = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=TEXT_SEQUENCE_LENGTH)(texts)
    feed = {"input_ids": np.asarray(packed["token_ids"]).astype(np.int32), "attention_mask": np.asarray(packed["padding_mask"]).astype(np.int32)}
    reference = ort.InferenceSession(str(result.workspace.root / "model.fp32.onnx")).run(["probs"], feed)[0]
    assert served.shape == (6, TEXT_CLASSES)
    np.testing.assert_allclose(served, reference, atol=1e-5)


def test_a_keras_hub_preset_folder_gives_its_tokenizer(tmp_path: Path) -> None:
    """A preset folder as keras-hub saves one (config.json from the backbone, tokenizer.json and its vocabulary)."""
    import keras_hub

    from pipeline.stages.tokenizer_export import tokenizer_from_path
    from tests.zoo.hub import TEXT_VOCABULARY

    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(TEXT_VOCABULARY), num_layers=1, num_heads=1, hidden_dim=8,
                                             intermediate_dim=8, max_sequence_length=16)
    backbone.save_to_preset(str(tmp_path / "preset"))
    keras_hub.tokenizers.BertTokenizer(vocabulary=TEXT_VOCABULARY, lowercase=True).save_to_preset(str(tmp_path / "preset"))
    tokenizer = tokenizer_from_path(tmp_path / "preset")
    assert type(tokenizer).__name__ == "BertTokenizer" and tokenizer.get_vocabulary() == TEXT_VOCABULARY and tokenizer.lowercase
    cased = tokenizer_from_path(_vocab(tmp_path / "cased.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "The", "the"]))
    assert not cased.lowercase and not cased.strip_accents  # a capital outside the [..] tokens: the vocabulary is cased
    uncased = tokenizer_from_path(_vocab(tmp_path / "uncased.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "cafe", "the"]))
    assert uncased.lowercase and uncased.strip_accents and [list(map(int, row)) for row in uncased(["Café"])] == [[4]]  # as BERT's uncased
    for bad, problem in ((tmp_path / "preset" / "config.json", "not a WordPiece vocabulary"),
                         (tmp_path, "keras-hub cannot load a tokenizer from it")):
        with pytest.raises(PipelineError, match=problem) as caught:
            tokenizer_from_path(bad)
        assert "keras-hub preset folder" in (caught.value.fix or "")


def test_given_tokenizer_options_refused_before_any_work(tmp_path: Path) -> None:
    vocab = _vocab(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
    for options, problem in (({"tokenizer": vocab}, "--tokenizer only applies with --raw-inputs"),
                             ({"raw_inputs": "image", "tokenizer": vocab}, "--tokenizer only applies to --raw-inputs text"),
                             ({"raw_inputs": "text", "tokenizer": tmp_path / "none.txt"}, "--tokenizer .*none.txt does not exist")):
        with pytest.raises(PipelineError, match=problem):
            BuildConfig(**options).validate()


def test_model_inputs_a_tokenizer_cannot_make_are_refused(tmp_path: Path) -> None:
    from pipeline.stages.tokenizer_export import given_tokenizer_files

    vocab = _vocab(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
    with pytest.raises(PipelineError, match=r"the model takes \['pixels', 'attention_mask'\]"):
        given_tokenizer_files(vocab, tmp_path / "t", tmp_path / "t.npz", texts=["a"], inputs=["pixels", "attention_mask"],
                              dtypes=["float32", "int32"], sequence_length=8)
    given_tokenizer_files(vocab, tmp_path / "t", tmp_path / "t.npz", texts=["a a", "b"], inputs=["input_word_ids", "input_mask", "input_type_ids"],
                          dtypes=["int32", "int32", "int32"], sequence_length=6)
    with np.load(tmp_path / "t.npz") as tokens:  # TF Hub's BERT names; [CLS] a a [SEP] pad pad, [CLS] [UNK] [SEP] ...
        assert tokens["input_word_ids"].tolist() == [[2, 4, 4, 3, 0, 0], [2, 1, 3, 0, 0, 0]]
        assert tokens["input_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]] and not tokens["input_type_ids"].any()


def test_a_vocabulary_written_with_crlf_line_ends_reads_as_its_tokens(tmp_path: Path) -> None:
    from pipeline.stages.tokenizer_export import tokenizer_from_path

    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nthe\r\ncat\r\n")
    assert tokenizer_from_path(path).get_vocabulary() == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat"]
