"""What the benchmarks share, and the only module one benchmark imports from another folder-mate:

- ``write_section``: one benchmark's results into a markdown file between ``<!-- bench:NAME -->``
  markers (each benchmark owns its block; rerunning it replaces the block and leaves the rest alone);
- ``hf_llama``: the Hugging Face Llama of a model config's vocab, width, depth, heads and MLP width, the
  reference generator the throughput benchmarks run beside ringzero's engine.

Benchmarks run as ``python bench/NAME.py``, so this folder is on their path as Python sets it.
"""

from __future__ import annotations

from pathlib import Path

from ringzero.model.config import ModelConfig


def write_section(path: Path, name: str, body: str, title: str = "# Benchmarks") -> None:
    """Replace (or append) the block between ``<!-- bench:name -->`` markers in ``path``."""
    path = Path(path)
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else f"{title}\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def hf_llama(cfg: ModelConfig):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_attention_heads,
            max_position_embeddings=cfg.max_position_embeddings,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=None,
        )
    ).eval()
