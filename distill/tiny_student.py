"""A tiny config-built causal LM for the perception-solved student on CPU: ``python -m distill tiny-student``.

The evidence input (`distill.evidence`) is text only, so the student can be any HF causal LM; on GPU, a real one
(``--model Qwen/Qwen3-1.7B``). On CPU the recipe builds one from a config (nothing is downloaded): a
``Qwen3ForCausalLM`` of 2 layers, hidden 128 (about 0.6M parameters), and a byte-level BPE tokenizer with Qwen's
special tokens and the toolkit's ChatML template (`forecasters.tiny_models`), trained on the train split of the SFT
set it will learn (user turns and assistant targets of every variant found; never the validation split), so the
sequences are short (about one token a word) and a training step costs milliseconds. The weights are random (std
`forecasters.tiny_models.INIT_STD`); the SFT run (``full_finetune``) trains all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.errors import InputError

#: The builder's record in the model directory (its size, vocabulary and corpus).
RECORD = "psr_tiny_student.json"


@dataclass
class TinyStudentConfig:
    """``python -m distill tiny-student``: a tiny random Qwen3 causal LM whose tokenizer fits an SFT set."""

    sft: str = field(metadata={"help": "SFT sets directory (python -m distill sft): its variants' train splits are "
                                       "the tokenizer's corpus"})
    out: str = field(metadata={"help": "model directory to write"})
    vocab_size: int = field(default=2048, metadata={"help": "BPE vocabulary (special tokens included)"})
    hidden_size: int = field(default=128, metadata={"help": "model width"})
    layers: int = field(default=2, metadata={"help": "decoder layers"})
    seed: int = field(default=0, metadata={"help": "weight initialisation seed"})


def corpus(sft_dir: str | Path) -> list[str]:
    """Every text of the train split of each variant under ``sft_dir`` (user turns and assistant targets)."""
    from distill.sft import TRAIN_SPLIT, VARIANTS, load_sft, read_set_info

    texts: list[str] = []
    for v in VARIANTS:
        if read_set_info(Path(sft_dir) / v) is None:
            continue
        for msgs in load_sft(Path(sft_dir) / v, TRAIN_SPLIT)["messages"]:
            texts += [part["text"] for m in msgs for part in m["content"] if part.get("text")]
    if not texts:
        raise InputError(f"{sft_dir}: no SFT set with a train split (run `python -m distill sft` first)")
    return texts


def build_tiny_student(cfg: TinyStudentConfig) -> dict[str, Any]:
    """Build the model and tokenizer into ``cfg.out`` (module docstring); returns a summary."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from eval.io import write_json
    from forecasters.tiny_models import CHAT_TEMPLATE, INIT_STD, SPECIAL_TOKENS

    texts = corpus(cfg.sft)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token=None, unk_token=None, model_max_length=4096)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    heads, head_dim = 4, 32
    config = Qwen3Config(vocab_size=len(tok), hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size,
                         num_hidden_layers=cfg.layers, num_attention_heads=heads, num_key_value_heads=2,
                         head_dim=head_dim, max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"], initializer_range=INIT_STD)
    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)
    words = sum(len(t.split()) for t in texts)
    tokens = sum(len(e.ids) for e in tk.encode_batch(texts))
    summary = {"out": str(out), "parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
               "hidden_size": cfg.hidden_size, "layers": cfg.layers, "corpus_texts": len(texts),
               "tokens_per_word": round(tokens / max(words, 1), 3), "sft": str(cfg.sft)}
    write_json(out / RECORD, summary)
    return summary
