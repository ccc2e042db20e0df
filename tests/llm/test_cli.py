"""``edgeport export-llm`` on a checkpoint directory (``save_pretrained`` of a random-init model) and
``edgeport generate`` with a ``tokenizer.json``: the text streamed is the eager model's greedy continuation."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("edgeport_xnnpack")

from edgeport.cli import main  # noqa: E402
from edgeport.testing.decoders import DECODERS, greedy_reference  # noqa: E402

WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(125)]  # 128 ids, bos 1, eos 2


def _tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path))
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    model = DECODERS["llama"](seed=3)
    model.save_pretrained(root / "ckpt")
    tok = _tokenizer(root / "tokenizer.json")
    return root, model, tok


def test_export_llm_then_generate_streams_the_eager_continuation(checkpoint, capsys):
    root, model, tok = checkpoint
    pte = root / "model.pte"
    assert main(["export-llm", str(root / "ckpt"), "--max-seq-len", "8", "--max-context-len", "40",
                 "-o", str(pte)]) == 0
    assert pte.stat().st_size > 0
    capsys.readouterr()
    prompt = "w5 w17 w42 w9"
    ids = tok.encode(prompt).ids
    reference = greedy_reference(model, ids, 12, 40)
    assert main(["generate", str(pte), "--tokenizer", str(root / "tokenizer.json"), "--prompt", prompt,
                 "--max-new-tokens", "12"]) in (0,)
    out = capsys.readouterr()
    expected = tok.decode(reference[: reference.index(2) + 1] if 2 in reference else reference)
    assert out.out.strip() == (prompt + expected).strip()
    assert "time to first token" in out.err and "decode" in out.err and "peak RSS" in out.err


def test_export_llm_bad_input(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export-llm", str(tmp_path / "empty"), "-o", str(tmp_path / "m.pte")]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(SystemExit):  # argparse refuses an unknown scheme, listing the choices
        main(["export-llm", str(tmp_path / "ckpt"), "--quantize", "4bit", "-o", str(tmp_path / "m.pte")])
    assert "invalid choice" in capsys.readouterr().err


def test_unsupported_scheme_in_the_api_names_the_supported_ones():
    from edgeport.llm import export_decoder

    with pytest.raises(ValueError, match="unsupported quantization scheme 'int2'.*8da4w"):
        export_decoder(DECODERS["llama"](), quantize="int2")


def test_generate_bad_input(checkpoint, tmp_path, capsys):
    root, _, _ = checkpoint
    assert main(["generate", str(tmp_path / "missing.pte"), "--tokenizer", str(root / "tokenizer.json"),
                 "--prompt", "w1"]) == 2
    assert "no program" in capsys.readouterr().err


def test_weights_apart_from_the_program_both_runtimes(checkpoint, tmp_path):
    """--weights-file: XNNPACK's weights land in TAG.ptd (ExecuTorch's delegate constant tags); edgeport's runtime
    and the stock runtime load the pair and give the eager tokens."""
    import numpy as np

    from edgeport.llm import GenerationConfig, TextRunner
    from edgeport.testing.stock_runtime import run_steps

    root, model, _ = checkpoint
    pte = tmp_path / "model.pte"
    assert main(["export-llm", str(root / "ckpt"), "--max-seq-len", "8", "--max-context-len", "40",
                 "--weights-file", "llama_weights", "-o", str(pte)]) == 0
    ptd = tmp_path / "llama_weights.ptd"
    assert ptd.stat().st_size > 4 * sum(p.numel() for p in model.model.layers.parameters()) // 2
    assert pte.stat().st_size < ptd.stat().st_size
    prompt = [1, 7, 19, 33]
    reference = greedy_reference(model, prompt, 10, 40)
    runner = TextRunner(str(pte), data_path=str(ptd))
    assert runner.generate(prompt, GenerationConfig(max_new_tokens=10, stop_on_eos=False)).tokens == reference
    steps = [[np.array([prompt], dtype=np.int64), np.arange(len(prompt), dtype=np.int64)]]
    steps += [[np.array([[t]], dtype=np.int64), np.array([len(prompt) + i], dtype=np.int64)]
              for i, t in enumerate(reference[:-1])]
    result = run_steps(pte.read_bytes(), steps, data=ptd.read_bytes())
    assert result.ok, result.describe() + "\n" + result.log
    assert [int(np.argmax(o[0][0, -1])) for o in result.outputs] == reference
