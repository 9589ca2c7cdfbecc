"""Fixtures of the retrieval tests: a tiny hand-built benchmark, tiny random image models, the packaged MiniLM."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from retrieval_tiny_bench import TINY_PERCEIVER, TINY_TOWER, build_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny benchmark with a `pixels` space and a `minilm` semantic space (treat as read-only)."""
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.encoders import PACKAGED_MINILM

    d = build_tiny(tmp_path_factory.mktemp("tiny") / "bench")
    encode_space(EncodeConfig(str(d), "minilm", PACKAGED_MINILM, kind="semantic"), progress=False)
    return d


@pytest.fixture
def tiny_copy(tiny_dir, tmp_path):
    """A private copy of the tiny benchmark for tests that write into it."""
    return shutil.copytree(tiny_dir, tmp_path / "bench", ignore=shutil.ignore_patterns(".cache"))


@pytest.fixture(scope="session")
def tiny_bench(tiny_dir):
    from eval.benchmark import Benchmark

    return Benchmark.load(tiny_dir)


@pytest.fixture(scope="session")
def text_encoder():
    from retrieval.encoders import PACKAGED_MINILM, TextEncoder

    return TextEncoder(PACKAGED_MINILM)


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(["the red ball falls off the table", "a box slides down the ramp", "rolling",
                            "resting on the floor", "bouncing"] * 4, tr)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=16)


@pytest.fixture(scope="session")
def tiny_image_models(tmp_path_factory):
    """Random-weight CLIP, SigLIP and DINOv2 saved with their image processors (and tokenizers): name -> dir."""
    import torch
    from transformers import (
        BitImageProcessor,
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        Dinov2Config,
        Dinov2Model,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
    )

    root = tmp_path_factory.mktemp("image-models")
    tok = _tokenizer()
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    text = dict(vocab_size=len(tok), max_position_embeddings=16, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                **tower)
    torch.manual_seed(0)
    out = {}
    d = root / "clip"
    CLIPModel(CLIPConfig(text_config=text, vision_config=dict(image_size=32, patch_size=8, **tower),
                         projection_dim=24)).save_pretrained(d)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(d)
    tok.save_pretrained(d)
    out["clip"] = d
    d = root / "siglip"
    SiglipModel(SiglipConfig(text_config=text, vision_config=dict(image_size=32, patch_size=8, **tower))
                ).save_pretrained(d)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(d)
    tok.save_pretrained(d)
    out["siglip"] = d
    d = root / "dinov2"
    Dinov2Model(Dinov2Config(image_size=32, patch_size=8, **tower)).save_pretrained(d)
    BitImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(d)
    out["dinov2"] = d
    return out


#: LFTR settings of the tests: the paper's architecture and objective, small and few epochs (CPU seconds).
TEST_LFTR = {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_samples": 8, "epochs": 8, "batch_size": 64,
             "lr": 1.0e-3, "n_random_negatives": 128, "n_hard_negatives": 64, "threads": 1}


@pytest.fixture(scope="session")
def lftr_test_config(tmp_path_factory):
    import yaml

    p = tmp_path_factory.mktemp("lftr-config") / "test.yaml"
    p.write_text(yaml.safe_dump(TEST_LFTR))
    return p


@pytest.fixture(scope="session")
def synth_sem_dir(synth_dir, tmp_path_factory):
    """The session's synthetic benchmark (no frames) plus a `minilm` semantic space (packaged MiniLM)."""
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.encoders import PACKAGED_MINILM

    d = tmp_path_factory.mktemp("synth-sem") / "bench"
    shutil.copytree(synth_dir, d, ignore=shutil.ignore_patterns("frames", "sim", ".cache"))
    encode_space(EncodeConfig(str(d), "minilm", PACKAGED_MINILM, kind="semantic"), progress=False)
    return d


@pytest.fixture(scope="session")
def synth_demo_out(synth_sem_dir, lftr_test_config, tmp_path_factory):
    """The folder of `retrieval demo` runs on the session's synthetic benchmark (treat as read-only)."""
    from eval.benchmark import Benchmark
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.lftr.jobs import DemoPlan, run_demo

    out = tmp_path_factory.mktemp("demo-runs")
    run_demo(Benchmark.load(synth_sem_dir), out, text_model=PACKAGED_MINILM, plan=DemoPlan(),
             configs=[lftr_test_config], log=lambda s: None, progress=False)
    return out


@pytest.fixture(scope="session")
def synth_demo(synth_demo_out):
    """`retrieval demo` on the session's synthetic benchmark: every baseline, oracle, LFTR and the fusion."""
    from eval.runs import read_run

    return {p.name.removesuffix(".parquet"): read_run(p) for p in sorted(synth_demo_out.glob("*.parquet"))}


@pytest.fixture(scope="session")
def tiny_ssl_tower(synth_dir, tmp_path_factory):
    """An SSL tower trained for 2 epochs on 96 train frames of the session's synthetic benchmark."""
    from eval.benchmark import Benchmark
    from retrieval.ssl import SSLConfig, train_ssl
    from retrieval.towers import load_dataclass

    out = tmp_path_factory.mktemp("towers") / "ssl"
    cfg = load_dataclass(SSLConfig, [], TINY_TOWER + ["optim.epochs=2", "max_frames=96"])
    rec = train_ssl(Benchmark.load(synth_dir), cfg, out, log=lambda s: None, progress=False)
    return out, rec


@pytest.fixture(scope="session")
def perceiver_world(tmp_path_factory):
    """A pretraining world for the perceiver: a 6-video simulator-truth build (step 1 only) of the seed the demo's
    towers use beside a seed-0 benchmark (`retrieval.towers.pretraining_world_seed`; none of the benchmark's videos)."""
    from eval.benchmark import Benchmark
    from eval.synth import build_benchmark
    from retrieval.towers import pretraining_world_seed

    out = tmp_path_factory.mktemp("perceiver-world") / "world"
    return Benchmark.load(build_benchmark(out, videos=6, seed=pretraining_world_seed(0), progress=False))


@pytest.fixture(scope="session")
def tiny_perceiver(perceiver_world, tmp_path_factory):
    """A tiny perceiver trained for 3 epochs on every window of `perceiver_world`: (dir, its record)."""
    from retrieval.perceiver import PerceiverConfig, train_perceiver
    from retrieval.towers import load_dataclass

    out = tmp_path_factory.mktemp("towers") / "perceiver"
    cfg = load_dataclass(PerceiverConfig, [], TINY_PERCEIVER + ["optim.epochs=3"])
    return out, train_perceiver(perceiver_world, cfg, out, log=lambda s: None, progress=False)


@pytest.fixture(scope="session")
def synth_towers_dir(synth_dir, tiny_ssl_tower, tiny_perceiver, tmp_path_factory):
    """A copy of the session's synthetic benchmark (its `pixels` and `sim` spaces, not its simulator records) with the
    `minilm` semantic space, an `ssl` space encoded by the tiny SSL tower, a `lit` space encoded by a tiny LiT
    tower (initialised from it) and the `perceiver` prefix space of the tiny perceiver: (dir, {name: tower dir})."""
    from eval.benchmark import Benchmark
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.lit import LiTConfig, train_lit
    from retrieval.towers import load_dataclass

    d = tmp_path_factory.mktemp("synth-towers") / "bench"
    top = Path(synth_dir)
    shutil.copytree(top, d, ignore=lambda at, names: [n for n in names if n == ".cache" or (n == "sim" and
                                                                                          Path(at) == top)])
    encode_space(EncodeConfig(str(d), "minilm", PACKAGED_MINILM, kind="semantic"), progress=False)
    lit = tmp_path_factory.mktemp("towers") / "lit"
    cfg = load_dataclass(LiTConfig, [], TINY_TOWER + ["optim.epochs=2", "max_pairs=128"], init=str(tiny_ssl_tower[0]))
    train_lit(Benchmark.load(d), cfg, lit, log=lambda s: None, progress=False)
    towers = {"ssl": tiny_ssl_tower[0], "lit": lit, "perceiver": tiny_perceiver[0]}
    for name, tower in towers.items():
        encode_space(EncodeConfig(str(d), name, str(tower), batch_size=128), progress=False)
    return d, towers
